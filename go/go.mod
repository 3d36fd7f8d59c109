module github.com/warden-redis/warden/go

// go-redis v9.23.0 declares go 1.26.0 in its go.mod, so no lower go line
// can build with it.
go 1.26.0

require (
	github.com/redis/go-redis/v9 v9.23.0
	go.uber.org/goleak v1.3.0
	golang.org/x/sys v0.48.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
)
