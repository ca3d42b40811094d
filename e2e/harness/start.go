package harness

import "context"

// StartProcess runs argv as a process called name, logging into
// dir/name.log, for tests that assemble a stack of their own.
func StartProcess(dir, name string, argv ...string) (*Process, error) {
	return startProcess(dir, name, argv...)
}

// WaitHTTP waits until url answers 200, p exits, or ctx ends.
func WaitHTTP(ctx context.Context, p *Process, url string) error {
	return waitHTTP(ctx, p, url)
}
