//! Backends: each module implements the ports for one set of services — `sqlite` for
//! `pulse serve` on one machine, `aws` for DynamoDB, SQS and EventBridge. They are the
//! only place SQL or SDK types appear; [`crate::app`] picks one from the configuration.

pub mod aws;
pub mod sqlite;
