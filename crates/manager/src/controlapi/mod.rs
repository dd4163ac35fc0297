//! controlapi (being written)
