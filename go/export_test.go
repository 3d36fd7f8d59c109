package warden

// NearOnPush makes the near cache's reader call f with each push it has
// read, before it applies it.
func NearOnPush(f func()) NearOption {
	return func(nc *NearCache) {
		nc.beforeApply = func(r any) {
			if _, ok := r.(push); ok {
				f()
			}
		}
	}
}
