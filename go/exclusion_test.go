package warden_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/warden-redis/warden/go/internal/testserver"
)

// Mutual exclusion across 4 OS processes of 50 goroutines each, 10^5
// acquisitions of one lock: the processes count who is inside in a shared
// memory-mapped file; nobody ever finds someone else there, and fences only
// go up.
func TestExclusionAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	srv := testserver.Start(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "exclusion")
	if out, err := exec.Command("go", "build", "-o", bin, "./testdata/exclusion").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	shared := filepath.Join(dir, "shared")
	if err := os.WriteFile(shared, make([]byte, 16), 0o600); err != nil {
		t.Fatal(err)
	}
	const procs, per = 4, 25000
	type result struct{ Acquired, Overlaps, Backwards, Errors int64 }
	results := make([]result, procs)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := exec.Command(bin, "-addr", srv.Addr(), "-shared", shared, "-goroutines", "50",
				"-n", strconv.Itoa(per)).Output()
			if err != nil {
				t.Errorf("process %d: %v", i, err)
				return
			}
			if err := json.Unmarshal(out, &results[i]); err != nil {
				t.Errorf("process %d: %v: %s", i, err, out)
			}
		}()
	}
	wg.Wait()
	var total result
	for _, r := range results {
		total.Acquired += r.Acquired
		total.Overlaps += r.Overlaps
		total.Backwards += r.Backwards
		total.Errors += r.Errors
	}
	t.Logf("%+v", total)
	if total.Acquired != procs*per || total.Overlaps != 0 || total.Backwards != 0 || total.Errors != 0 {
		t.Fatalf("%+v, want %d acquisitions, no overlap, no error", total, procs*per)
	}
}
