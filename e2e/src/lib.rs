//! The ferrolb lab: a real Kubernetes control plane (etcd, kube-apiserver,
//! kube-controller-manager), nodes running a real kube-proxy, pods, clients and an FRR router,
//! each host a network namespace on this machine. See `docs/lab.md`.
//!
//! Traffic stays inside namespaces the lab made; the host namespace holds an `unreachable` route
//! for the whole lab range and only talks to the lab over its own bridge.

pub mod apiserver_metrics;
pub mod bench;
pub mod cluster;
pub mod cmd;
pub mod containerlab;
pub mod demo;
pub mod echo;
pub mod explain;
pub mod faults;
pub mod ferrolb;
pub mod golden;
pub mod helm;
pub mod helm_demo;
pub mod lab;
pub mod logs;
pub mod metallb;
pub mod ndp;
pub mod nemesis;
pub mod pki;
pub mod probe;
pub mod process;
pub mod router;
pub mod scope;
pub mod service;
pub mod simulated_nodes;
pub mod suite;
pub mod systems;
pub mod topology;

pub use lab::{Lab, LabPod, down, is_root, lab_dir};
pub use topology::{Families, Options, ProxyMode, Topology};
