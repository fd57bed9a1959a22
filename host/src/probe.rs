//! The disk probe: does the cloudimg qcow2 overlay exist for a VM?
