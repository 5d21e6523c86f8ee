//! Integration tests, built as one binary. Each behaviour runs on both backends: SQLite
//! (a fresh file per test) and DynamoDB + SQS FIFO on moto (a fresh table and queue per
//! test). `scripts/test.sh` starts moto and sets `PULSE_TEST_MOTO_URL`.

mod agent_files;
mod approvals;
mod aws_faults;
mod budgets;
mod conformance;
mod conversation;
mod conversation_store;
mod dashboard;
mod discord;
mod gateway;
mod heartbeats;
mod hooks;
mod inbound;
mod lambda;
mod large_records;
mod layout;
mod lifecycle;
mod listener;
mod llm;
mod local_model;
mod mcp;
mod memory;
mod messages_api;
mod power_cut;
mod queue;
mod reminders;
mod retention;
mod secrets_at_rest;
mod side_effects;
mod slack;
mod status;
mod steering;
mod telegram;
mod thinking;
mod traces;
