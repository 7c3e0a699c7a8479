//! The IP allocator (in progress).
