//! The real plugin components through the real host: one test binary.

mod cache;
mod capture;
mod examples;
mod failure;
mod held;
mod kit;
mod oci;
mod policy;
mod reload;
mod sandbox;
mod selection;
mod serve_reload;
mod signed;
mod vendor;
mod workers;
