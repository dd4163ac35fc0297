//! orchestrator (being written)
