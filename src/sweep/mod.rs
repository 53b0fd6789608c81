//! Kernel socket sweeping (SPEC "Failover behaviour" step 5).
pub mod diag;
