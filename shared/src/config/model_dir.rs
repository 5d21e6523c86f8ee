//! A sentence-transformers model directory on disk: what is in it, where one is installed,
//! and the label its vectors carry.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The directory name `pulse models install minilm` installs all-MiniLM-L6-v2 under, and
/// the one looked for when no embeddings model is configured.
pub const MINILM_DIR: &str = "all-MiniLM-L6-v2";

/// The files a model directory must hold.
pub const MODEL_FILES: [&str; 3] = ["config.json", "tokenizer.json", "model.safetensors"];

/// The tokens a text is cut to when the directory does not say (`sentence_bert_config.json`'s
/// `max_seq_length`; all-MiniLM-L6-v2 says 256).
const DEFAULT_MAX_TOKENS: usize = 256;

/// A model directory that holds what the local embedder needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelDir {
    /// The directory.
    pub path: PathBuf,
    /// The label its vectors carry: the directory's name, a fingerprint of its
    /// configuration and weights, and the dimensions, e.g.
    /// `local:all-MiniLM-L6-v2@53aa5117/384`. A different model (another fine-tune in a
    /// directory of the same name) has another fingerprint, so vectors never mix.
    pub label: String,
    /// The vectors' dimensions (`hidden_size`).
    pub dimensions: usize,
    /// The tokens a text is cut to.
    pub max_tokens: usize,
}

/// Why a directory is not a model the local embedder can load.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct ModelDirError {
    /// The directory.
    pub path: String,
    /// What is wrong, and what to do.
    pub reason: String,
}

impl ModelDir {
    /// Reads `path`'s configuration and fingerprints its weights (the configuration, the
    /// weights' header and their first mebibyte: milliseconds, not the whole file).
    pub fn inspect(path: &Path) -> Result<Self, ModelDirError> {
        let fail = |reason: String| ModelDirError {
            path: path.display().to_string(),
            reason,
        };
        if !path.is_dir() {
            return Err(fail(
                "is not a directory; give a sentence-transformers model directory, or install one with `pulse models install minilm`".into(),
            ));
        }
        if let Some(missing) = MODEL_FILES.iter().find(|f| !path.join(f).is_file()) {
            return Err(fail(format!(
                "has no {missing}; a model directory holds {} (a sentence-transformers model saved with safetensors)",
                MODEL_FILES.join(", ")
            )));
        }
        let config_bytes = std::fs::read(path.join("config.json"))
            .map_err(|e| fail(format!("cannot read config.json: {e}")))?;
        let config: serde_json::Value = serde_json::from_slice(&config_bytes)
            .map_err(|e| fail(format!("config.json is not JSON: {e}")))?;
        if let Some(kind) = config.get("model_type").and_then(|t| t.as_str())
            && kind != "bert"
        {
            return Err(fail(format!(
                "config.json says model_type {kind:?}; the local embedder runs BERT models (all-MiniLM-L6-v2 and its kin)"
            )));
        }
        let dimensions = config
            .get("hidden_size")
            .and_then(serde_json::Value::as_u64)
            .filter(|d| (8..=8192).contains(d))
            .ok_or_else(|| fail("config.json has no hidden_size from 8 to 8192".into()))?
            as usize;
        let max_tokens = std::fs::read(path.join("sentence_bert_config.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|c| c.get("max_seq_length").and_then(serde_json::Value::as_u64))
            .map_or(DEFAULT_MAX_TOKENS, |n| n as usize)
            .clamp(8, 512);

        let mut hash = Sha256::new();
        hash.update(&config_bytes);
        let mut weights = std::fs::File::open(path.join("model.safetensors"))
            .map_err(|e| fail(format!("cannot read model.safetensors: {e}")))?;
        let mut head = vec![0u8; 1 << 20];
        let mut read = 0;
        while read < head.len() {
            match weights.read(&mut head[read..]) {
                Ok(0) => break,
                Ok(n) => read += n,
                Err(e) => return Err(fail(format!("cannot read model.safetensors: {e}"))),
            }
        }
        if read < 8 {
            return Err(fail("model.safetensors is empty or cut short".into()));
        }
        hash.update(&head[..read]);
        let fingerprint = hex::encode(&hash.finalize()[..4]);
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "model".into());
        Ok(Self {
            path: path.to_owned(),
            label: format!("local:{name}@{fingerprint}/{dimensions}"),
            dimensions,
            max_tokens,
        })
    }

    /// The first of `dirs` holding an installed all-MiniLM-L6-v2 (`DIR/all-MiniLM-L6-v2`).
    pub fn find_installed(dirs: &[PathBuf]) -> Option<PathBuf> {
        dirs.iter()
            .map(|d| d.join(MINILM_DIR))
            .find(|p| MODEL_FILES.iter().all(|f| p.join(f).is_file()))
    }
}

/// Where `pulse models install` puts models when told nowhere else: `PULSE_MODELS_DIR`,
/// else `$XDG_DATA_HOME/pulse/models`, else `~/.local/share/pulse/models`.
pub fn default_models_dir(
    models_dir: Option<&str>,
    xdg_data_home: Option<&str>,
    home: Option<&str>,
) -> Option<PathBuf> {
    let set = |v: Option<&str>| {
        v.map(str::trim)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    set(models_dir)
        .or_else(|| set(xdg_data_home).map(|d| d.join("pulse").join("models")))
        .or_else(|| set(home).map(|h| h.join(".local").join("share").join("pulse").join("models")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model_dir(dir: &Path, config: &str, weights: &[u8]) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("config.json"), config).unwrap();
        std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
        std::fs::write(dir.join("model.safetensors"), weights).unwrap();
    }

    #[test]
    fn a_directory_is_labelled_by_its_name_its_contents_and_its_dimensions() {
        let tmp = tempfile::tempdir().unwrap();
        let a = tmp.path().join("one").join(MINILM_DIR);
        let b = tmp.path().join("two").join(MINILM_DIR);
        let config = r#"{"model_type":"bert","hidden_size":384}"#;
        model_dir(&a, config, &[1; 64]);
        model_dir(&b, config, &[2; 64]);
        let (ia, ib) = (
            ModelDir::inspect(&a).unwrap(),
            ModelDir::inspect(&b).unwrap(),
        );
        assert!(
            ia.label.starts_with("local:all-MiniLM-L6-v2@"),
            "{}",
            ia.label
        );
        assert!(ia.label.ends_with("/384"), "{}", ia.label);
        assert_eq!(ia.dimensions, 384);
        assert_eq!(ia.max_tokens, 256);
        assert_ne!(ia.label, ib.label, "other weights, another label");
        assert_eq!(
            ModelDir::inspect(&a).unwrap(),
            ia,
            "the same files, the same label"
        );
        std::fs::write(
            a.join("sentence_bert_config.json"),
            r#"{"max_seq_length":128}"#,
        )
        .unwrap();
        assert_eq!(ModelDir::inspect(&a).unwrap().max_tokens, 128);
        assert_eq!(
            ModelDir::find_installed(&[tmp.path().join("none"), tmp.path().join("two")]),
            Some(b.clone())
        );
    }

    #[test]
    fn what_is_wrong_with_a_directory_is_said() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("m");
        let e = ModelDir::inspect(&dir).unwrap_err().to_string();
        assert!(
            e.contains("is not a directory") && e.contains("pulse models install"),
            "{e}"
        );
        model_dir(&dir, r#"{"model_type":"bert","hidden_size":384}"#, &[1; 64]);
        std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
        let e = ModelDir::inspect(&dir).unwrap_err().to_string();
        assert!(e.contains("has no tokenizer.json"), "{e}");
        model_dir(
            &dir,
            r#"{"model_type":"llama","hidden_size":384}"#,
            &[1; 64],
        );
        let e = ModelDir::inspect(&dir).unwrap_err().to_string();
        assert!(e.contains("\"llama\"") && e.contains("BERT"), "{e}");
        model_dir(&dir, r#"{"model_type":"bert"}"#, &[1; 64]);
        let e = ModelDir::inspect(&dir).unwrap_err().to_string();
        assert!(e.contains("hidden_size"), "{e}");
        assert!(ModelDir::find_installed(&[tmp.path().to_owned()]).is_none());
    }

    #[test]
    fn the_models_directory_follows_the_environment() {
        let d = |m, x, h| default_models_dir(m, x, h);
        assert_eq!(
            d(Some("/m"), Some("/x"), Some("/h")),
            Some(PathBuf::from("/m"))
        );
        assert_eq!(
            d(None, Some("/x"), Some("/h")),
            Some(PathBuf::from("/x/pulse/models"))
        );
        assert_eq!(
            d(Some(" "), None, Some("/h")),
            Some(PathBuf::from("/h/.local/share/pulse/models"))
        );
        assert_eq!(d(None, None, None), None);
    }
}
