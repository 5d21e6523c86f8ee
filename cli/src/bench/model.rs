//! The local model a bench measures.

use std::path::Path;

use pulse_shared::embed::ModelDir;

use crate::Failure;

/// The model directory to measure: `--model`, else an installed all-MiniLM-L6-v2.
pub(super) fn model_dir(model: Option<&Path>) -> Result<Option<ModelDir>, Failure> {
    let path = match model {
        Some(p) => Some(p.to_owned()),
        None => ModelDir::find_installed(
            &pulse_shared::config::Env::process()
                .models_dir()
                .into_iter()
                .collect::<Vec<_>>(),
        ),
    };
    path.map(|p| ModelDir::inspect(&p).map_err(|e| Failure::Input(format!("--model {e}"))))
        .transpose()
}
