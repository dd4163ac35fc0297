//! The scheduler (being written): filters, then spread. `constraint` parses and matches placement
//! constraints.

pub mod constraint;
