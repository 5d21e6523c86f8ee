//! Secrets from SSM Parameter Store: every parameter directly under a path (for example
//! `/pulse/prod/DISCORD_BOT_TOKEN`, a SecureString) becomes the configuration variable
//! its last segment names, read with decryption in one paginated `GetParametersByPath`.
//!
//! The Lambda functions read them on their first invocation (see [`crate::lambda::Ready`]),
//! so the values never sit in the template, its parameters or the functions' environment.

use std::collections::BTreeMap;

/// Why the secrets could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    /// The path is not an SSM path.
    #[error(
        "PULSE_SECRETS_PATH {0:?} is not a parameter path: give one that starts with '/', such as /pulse/prod"
    )]
    BadPath(String),
    /// A parameter's name is not a configuration variable's.
    #[error(
        "SSM parameter {0:?} is under PULSE_SECRETS_PATH but its last segment is not a variable name (A-Z, 0-9, _), such as DISCORD_BOT_TOKEN"
    )]
    BadName(String),
    /// SSM answered with an error, or could not be reached.
    #[error(
        "could not read the secrets under {path} from SSM Parameter Store ({detail}); the function needs ssm:GetParametersByPath on that path"
    )]
    Ssm {
        /// The path.
        path: String,
        /// What the SDK said.
        detail: String,
    },
}

/// Where the secrets are: an SSM path.
#[derive(Clone, Debug)]
pub struct SecretParameters {
    client: aws_sdk_ssm::Client,
    path: String,
}

impl SecretParameters {
    /// Secrets under `path`; `endpoint_url` points at an emulator. Builds the client
    /// only: no network call is made here.
    pub async fn new(path: &str, endpoint_url: Option<&str>) -> Result<Self, SecretsError> {
        let path = path.trim().trim_end_matches('/');
        if !path.starts_with('/') || path.len() < 2 {
            return Err(SecretsError::BadPath(path.to_owned()));
        }
        let sdk = super::sdk_config(endpoint_url).await;
        Ok(Self {
            client: aws_sdk_ssm::Client::from_conf(
                aws_sdk_ssm::config::Builder::from(&sdk)
                    .interceptor(super::actions_log::ActionsLog)
                    .build(),
            ),
            path: path.to_owned(),
        })
    }

    /// The path read.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Reads every parameter directly under the path, decrypted: variable name → value.
    pub async fn load(&self) -> Result<BTreeMap<String, String>, SecretsError> {
        let mut vars = BTreeMap::new();
        let mut pages = self
            .client
            .get_parameters_by_path()
            .path(&self.path)
            .recursive(false)
            .with_decryption(true)
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| SecretsError::Ssm {
                path: self.path.clone(),
                detail: aws_sdk_ssm::error::DisplayErrorContext(e).to_string(),
            })?;
            for p in page.parameters() {
                let name = p.name().unwrap_or_default();
                let var = name.rsplit('/').next().unwrap_or_default();
                if var.is_empty()
                    || !var
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                {
                    return Err(SecretsError::BadName(name.to_owned()));
                }
                vars.insert(var.to_owned(), p.value().unwrap_or_default().to_owned());
            }
        }
        Ok(vars)
    }
}
