//! kube-proxy's chain names for a Service, computed as kube-proxy computes them.
