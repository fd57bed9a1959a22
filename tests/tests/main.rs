//! The real plugin components through the real host: one test binary.

mod cache;
mod capture;
mod examples;
mod failure;
mod held;
mod kit;
mod oci;
mod policy;
mod sandbox;
mod selection;
mod vendor;
mod workers;
