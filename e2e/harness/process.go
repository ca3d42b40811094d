package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process is a child process whose output goes to a log file.
type Process struct {
	Name    string
	LogPath string
	argv    []string
	// env is added to the inherited environment ("KEY=VALUE"), restarts
	// included.
	env  []string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startProcess runs name's command with stdout and stderr in dir/name.log.
func startProcess(dir, name string, argv ...string) (*Process, error) {
	return startProcessEnv(dir, name, nil, argv...)
}

// startProcessEnv is startProcess with env ("KEY=VALUE") added to the
// inherited environment.
func startProcessEnv(dir, name string, env []string, argv ...string) (*Process, error) {
	return runProcess(filepath.Join(dir, name+".log"), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, name, argv, env)
}

// runProcess starts argv logging to logPath opened with flag, with env
// ("KEY=VALUE") added to the inherited environment.
func runProcess(logPath string, flag int, name string, argv, env []string) (*Process, error) {
	f, err := os.OpenFile(logPath, flag, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, argv: argv, env: env, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process's id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM, waits up to grace, then kills.
func (p *Process) Stop(grace time.Duration) error {
	if p.Exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	var exit *exec.ExitError
	if p.err != nil && !errors.As(p.err, &exit) {
		return fmt.Errorf("stop %s: %w", p.Name, p.err)
	}
	return nil
}

// Kill ends the process at once with SIGKILL, as a crash would, and waits
// for it.
func (p *Process) Kill() {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Signal sends sig to the running process, e.g. SIGHUP to make duet
// reload its configuration.
func (p *Process) Signal(sig os.Signal) error {
	if p.Exited() {
		return fmt.Errorf("signal %s: %s has exited", sig, p.Name)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %s: %w", p.Name, err)
	}
	return nil
}

// Restart starts the process's command again (after Stop or Kill), logging
// after what it logged before. It does not wait for readiness.
func (p *Process) Restart() error {
	if !p.Exited() {
		return fmt.Errorf("restart %s: still running", p.Name)
	}
	fresh, err := runProcess(p.LogPath, os.O_APPEND|os.O_WRONLY, p.Name, p.argv, p.env)
	if err != nil {
		return err
	}
	p.cmd, p.done, p.err = fresh.cmd, fresh.done, nil
	return nil
}

// Tail returns the last n bytes of the process log.
func (p *Process) Tail(n int) string {
	data, err := os.ReadFile(p.LogPath)
	if err != nil {
		return err.Error()
	}
	if len(data) > n {
		data = data[len(data)-n:]
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			data = data[i+1:]
		}
	}
	return string(data)
}

// waitHTTP polls url until it answers 200, the process exits, or ctx ends.
func waitHTTP(ctx context.Context, p *Process, url string) error {
	client := &http.Client{Timeout: time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if p.Exited() {
			tail := p.Tail(4000)
			if strings.Contains(strings.ToLower(tail), "address already in use") {
				return fmt.Errorf("%w: %s exited before %s was ready:\n%s", errPortTaken, p.Name, url, tail)
			}
			return fmt.Errorf("%s exited before %s was ready:\n%s", p.Name, url, tail)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %s not ready: %w\n%s", p.Name, url, ctx.Err(), p.Tail(4000))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// errPortTaken marks a process that could not bind a port freePorts chose:
// another process (a test package running in parallel) took it in between.
var errPortTaken = errors.New("a chosen loopback port was taken")

// freePorts reserves n distinct free loopback ports. The listeners are
// closed before returning, so a port can in rare cases be taken again
// (errPortTaken; Start then starts the stack again on other ports).
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var lis []net.Listener
	defer func() {
		for _, l := range lis {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		lis = append(lis, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func hostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
