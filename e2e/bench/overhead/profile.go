package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// profiler fetches a CPU profile from duet's admin port (listen.pprof)
// while a run loads it, then its allocation profile.
type profiler struct {
	done chan error
}

// startProfile starts fetching seconds of CPU profile from the duet whose
// admin base URL is admin, into dir/name.cpu.pprof, then its allocations
// since start into dir/name.allocs.pprof.
func startProfile(ctx context.Context, admin string, seconds int, dir, name string) *profiler {
	p := &profiler{done: make(chan error, 1)}
	base := filepath.Join(dir, strings.NewReplacer(" ", "-", ",", "", "/", "", "+", "plus").Replace(name))
	go func() {
		err := fetch(ctx, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", admin, seconds), base+".cpu.pprof",
			time.Duration(seconds+30)*time.Second)
		if err == nil {
			err = fetch(ctx, admin+"/debug/pprof/allocs", base+".allocs.pprof", 30*time.Second)
		}
		p.done <- err
	}()
	return p
}

// wait returns once the profiles are written.
func (p *profiler) wait() error { return <-p.done }

// fetch writes what GET url answers into path.
func fetch(ctx context.Context, url, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile: GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("profile: %s: %w", path, err)
	}
	return f.Close()
}
