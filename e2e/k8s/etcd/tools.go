//go:build tools

// Package tools pins the etcd binaries that ../../install-deps builds from
// this module, so `go mod tidy` keeps go.sum complete for them. The build tag
// keeps it out of every real build.
package tools

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "go.etcd.io/etcd/server/v3"
)
