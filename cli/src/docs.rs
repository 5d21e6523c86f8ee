//! `pulse docs`: the book's reference pages, made from the code — the command line from
//! the clap definitions, the configuration from the list of variables. The test suite
//! fails when the pages in `docs/src/reference/` differ from what this prints.

use clap::{Command, CommandFactory, Parser};

use crate::Cli;

/// Which page.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum DocsCmd {
    /// The command-line reference (docs/src/reference/cli.md).
    Cli,
    /// The configuration reference (docs/src/reference/configuration.md).
    Config,
    /// The JSON Schema of an agent directory's file (docs/src/reference/agent.schema.json,
    /// schedules.schema.json, hooks.schema.json, webhooks.schema.json, tools.schema.json).
    Schema {
        /// Which file.
        #[arg(value_enum)]
        file: SchemaFile,
    },
    /// Check command lines the book shows (a JSON array of argument arrays, without the
    /// leading `pulse`): prints `index<TAB>why` for each the command line refuses.
    Check {
        /// The JSON file.
        file: std::path::PathBuf,
    },
}

/// The files of an agent directory that have a schema.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum SchemaFile {
    /// agent.toml.
    Agent,
    /// schedules.toml.
    Schedules,
    /// hooks.toml.
    Hooks,
    /// webhooks.toml.
    Webhooks,
    /// tools.toml.
    Tools,
}

/// Prints the page.
pub(crate) fn run(cmd: DocsCmd) -> Result<(), crate::Failure> {
    match cmd {
        DocsCmd::Cli => print!("{}", cli_reference()),
        DocsCmd::Config => print!("{}", pulse_shared::config::variables::reference()),
        DocsCmd::Schema { file } => {
            let schema = match file {
                SchemaFile::Agent => pulse_shared::agent_dir::agent_schema(),
                SchemaFile::Schedules => pulse_shared::agent_dir::schedules_schema(),
                SchemaFile::Hooks => pulse_shared::agent_dir::hooks_schema(),
                SchemaFile::Webhooks => pulse_shared::agent_dir::webhooks_schema(),
                SchemaFile::Tools => pulse_shared::agent_dir::tools_schema(),
            };
            println!(
                "{}",
                serde_json::to_string_pretty(&schema).expect("a schema is JSON")
            );
        }
        DocsCmd::Check { file } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| crate::Failure::Input(format!("{}: {e}", file.display())))?;
            let lines: Vec<Vec<String>> = serde_json::from_str(&text)
                .map_err(|e| crate::Failure::Input(format!("{}: {e}", file.display())))?;
            for (i, words) in lines.iter().enumerate() {
                if let Err(e) = Cli::try_parse_from(
                    std::iter::once("pulse").chain(words.iter().map(String::as_str)),
                ) {
                    use clap::error::ErrorKind;
                    if !matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                        let why = e.to_string();
                        println!("{i}\t{}", why.lines().next().unwrap_or_default());
                    }
                }
            }
        }
    }
    Ok(())
}

/// Every command's `--help`, in the order `pulse --help` lists them.
fn cli_reference() -> String {
    let mut root = same_everywhere(Cli::command());
    root.build();
    let mut page = String::from(
        "# Command line\n\n\
         <!-- Made by `pulse docs cli` from the clap definitions: edit those. -->\n\n\
         Every command's `--help`. An agent is named by its id, its name or its alias \
         wherever a command takes one; every listing takes `--json`. Commands exit 0 when \
         done, 1 when the work failed (the backend is unreachable, or `pulse status` finds \
         something that needs attention) and 2 on bad input, in which case nothing is \
         written. The options of `pulse` itself (`--db`, `--json`, `--stack`) are taken \
         by every command.\n",
    );
    let mut index = String::from("\n| command | what it does |\n|---|---|\n");
    let mut sections = format!(
        "\n## pulse\n\n```text\n{}\n```\n",
        root.render_long_help().to_string().trim_end()
    );
    walk(&root, &mut index, &mut sections);
    page.push_str(&index);
    page.push_str(&sections);
    page
}

/// Help that does not depend on the environment it is printed in: no values read from
/// variables (lines are not wrapped to the terminal either: clap is built without it).
fn same_everywhere(cmd: Command) -> Command {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|c| c.get_name().to_owned())
        .collect();
    let mut cmd = cmd.mut_args(|a| a.hide_env_values(true));
    for name in names {
        cmd = cmd.mut_subcommand(name, same_everywhere);
    }
    cmd
}

fn walk(cmd: &Command, index: &mut String, sections: &mut String) {
    for sub in cmd
        .get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
    {
        let path = sub
            .get_bin_name()
            .map_or_else(|| sub.get_name().to_owned(), str::to_owned);
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        let first = about
            .split(". ")
            .next()
            .unwrap_or_default()
            .trim_end_matches('.');
        index.push_str(&format!(
            "| [`{path}`](#{}) | {} |\n",
            anchor(&path),
            first.replace('|', "\\|")
        ));
        let help = without_globals(sub.clone()).render_long_help().to_string();
        sections.push_str(&format!(
            "\n## {path}\n\n```text\n{}\n```\n",
            help.trim_end()
        ));
        walk(sub, index, sections);
    }
}

/// The options every command takes (`--db`, `--json`, `--stack`) are shown once, under
/// `pulse`.
fn without_globals(mut cmd: Command) -> Command {
    let globals: Vec<String> = cmd
        .get_arguments()
        .filter(|a| a.is_global_set())
        .map(|a| a.get_id().to_string())
        .collect();
    for id in globals {
        cmd = cmd.mut_arg(id, |a| a.hide(true));
    }
    cmd
}

/// The anchor mdBook gives a heading.
fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}
