//! dispatcher (being written)
