//! The real plugin components through the real host: one test binary.

mod cache;
mod examples;
mod sandbox;
mod selection;
