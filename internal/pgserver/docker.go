package pgserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Finding a Docker daemon, in plain Go: the Docker client lives in the
// container program's own module (see container.go), not in ours.

const dockerProbe = 3 * time.Second

// dockerAvailable reports whether a Docker daemon answers GET /_ping within
// dockerProbe, at DOCKER_HOST or else at the first Docker socket found.
func dockerAvailable(ctx context.Context) error {
	network, address, err := dockerEndpoint()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, dockerProbe)
	defer cancel()
	if network == "tcp" && os.Getenv("DOCKER_TLS_VERIFY") != "" {
		// A TLS daemon wants client certificates that only the Docker
		// client reads: a connection accepted is the answer we can get.
		conn, err := (&net.Dialer{}).DialContext(ctx, network, address)
		if err != nil {
			return fmt.Errorf("docker at %s://%s: %w", network, address, err)
		}
		return conn.Close()
	}
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, address)
		},
		DisableKeepAlives: true, // no idle connection outlives the probe
	}
	defer transport.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker/_ping", http.NoBody)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: transport}).Do(req)
	if err != nil {
		return fmt.Errorf("docker at %s://%s: %w", network, address, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("docker at %s://%s: GET /_ping: %s %q", network, address, resp.Status, body)
	}
	return nil
}

// dockerEndpoint returns where the daemon should listen: DOCKER_HOST when
// set (unix:// or tcp://), else the first of the usual sockets that exists.
func dockerEndpoint() (network, address string, err error) {
	if host := os.Getenv("DOCKER_HOST"); host != "" {
		u, err := url.Parse(host)
		if err != nil {
			return "", "", fmt.Errorf("DOCKER_HOST=%q: %w", host, err)
		}
		switch u.Scheme {
		case "unix":
			return "unix", u.Path, nil
		case "tcp":
			return "tcp", u.Host, nil
		default:
			return "", "", fmt.Errorf("DOCKER_HOST=%q: only unix:// and tcp:// are probed", host)
		}
	}
	candidates := []string{"/var/run/docker.sock", "/run/docker.sock"}
	if home, err := os.UserHomeDir(); err == nil {
		candidates = append(candidates, filepath.Join(home, ".docker", "run", "docker.sock"), filepath.Join(home, ".docker", "desktop", "docker.sock"))
	}
	if dir := os.Getenv("XDG_RUNTIME_DIR"); dir != "" {
		candidates = append(candidates, filepath.Join(dir, "docker.sock"))
	}
	for _, c := range candidates {
		if fi, err := os.Stat(c); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return "unix", c, nil
		}
	}
	return "", "", errors.New("no DOCKER_HOST and no Docker socket in " + strings.Join(candidates, ", "))
}
