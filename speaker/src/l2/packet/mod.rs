//! ARP and NDP frames: parsing requests, building replies and gratuitous announcements.
