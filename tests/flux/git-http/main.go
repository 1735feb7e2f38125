// git-http serves the Git repositories under a directory over Git's smart HTTP protocol, by running
// git's own git-http-backend as a CGI program (net/http/cgi), for Flux's source-controller in the tests
// of #50: it fetches only http(s) and ssh URLs, and its Git client speaks only the smart protocol.
//
//	git-http ROOT ADDR
//
// serves ROOT/<repo>.git at http://ADDR/<repo>.git (read only: pushes are refused) until killed. It prints
// the address it listens on (ADDR may have port 0) as its first line of output.
package main

import (
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: git-http ROOT ADDR")
		os.Exit(2)
	}
	root, err := filepath.Abs(os.Args[1])
	if err != nil {
		log.Fatal(err)
	}
	out, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		log.Fatalf("git-http: git is not installed: %v", err)
	}
	backend := filepath.Join(strings.TrimSpace(string(out)), "git-http-backend")
	handler := &cgi.Handler{
		Path: backend,
		Dir:  root,
		Env: []string{
			"GIT_PROJECT_ROOT=" + root,
			"GIT_HTTP_EXPORT_ALL=1",
		},
	}
	ln, err := net.Listen("tcp", os.Args[2])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ln.Addr().String())
	log.Fatal(http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("service") == "git-receive-pack" || strings.HasSuffix(r.URL.Path, "/git-receive-pack") {
			http.Error(w, "read only", http.StatusForbidden)
			return
		}
		handler.ServeHTTP(w, r)
	})))
}
