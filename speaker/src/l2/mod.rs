//! Layer 2 mode: answering ARP and NDP for the Service IPs this node owns.

pub mod packet;
