//! The host's integration tests: one test binary (each links wasmtime
//! and kube once, not once per file). Each module is one subject; the
//! shared test doubles are in `support/`.

mod support;

mod alerts;
mod apply;
mod binding;
mod capture;
mod cli;
mod cocoon;
mod conformance;
mod conversations;
mod corpus;
mod deploy;
mod faults;
mod interactive;
mod kube;
mod listener;
mod oci;
mod prepare;
mod props;
mod ps_props;
mod ready;
mod realkube;
mod realkube_nodes;
mod restart;
mod sac;
mod serve;
mod settings;
mod signing;
mod wake;
