// gitops-health: how generic tools see netwave's objects, for netwave's tests (#50). It computes an
// object's health with the libraries those tools use, so a test asserts what they would conclude:
//
//   - kstatus: sigs.k8s.io/cli-utils' status.Compute, the rule `kubectl wait`, Flux's health checks
//     and cli-utils apply;
//   - Argo CD: the object's health.lua from a resource_customizations tree
//     (<dir>/<group>/<Kind>/health.lua), run in gopher-lua the way Argo CD's util/lua runs a health
//     script, with the libraries Argo CD gives a user's script (package, base, table, a safe os),
//     which are fewer than a built-in script gets, so a script that passes here passes there.
//
// Usage:
//
//	gitops-health check DIR < objects.json   a JSON array of objects (or a List); prints one JSON line per
//	                                         object: kind, name, kstatus {status, message}, health {status, message}
//	gitops-health test DIR                   runs every health_test.yaml under DIR (Argo CD's layout and
//	                                         format: tests[].healthStatus {status, message}, inputPath);
//	                                         prints each case and exits 1 if one fails
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

// health is what a health.lua returns, and what Argo CD records.
type health struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

type verdict struct {
	Kind    string  `json:"kind"`
	Name    string  `json:"name"`
	Kstatus health  `json:"kstatus"`
	Health  *health `json:"health,omitempty"`
}

func main() {
	if len(os.Args) != 3 {
		fail("usage: gitops-health check DIR < objects.json | gitops-health test DIR")
	}
	dir := os.Args[2]
	switch os.Args[1] {
	case "check":
		check(dir)
	case "test":
		if !runTests(dir) {
			os.Exit(1)
		}
	default:
		fail("unknown command " + os.Args[1])
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "gitops-health: "+msg)
	os.Exit(2)
}

func check(dir string) {
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(err.Error())
	}
	var doc any
	if err := json.Unmarshal(in, &doc); err != nil {
		fail("stdin: " + err.Error())
	}
	items, ok := doc.([]any)
	if m, isMap := doc.(map[string]any); isMap {
		items, ok = m["items"].([]any)
	}
	if !ok {
		fail("stdin: a JSON array of objects, or a List")
	}
	out := json.NewEncoder(os.Stdout)
	for _, it := range items {
		raw, _ := json.Marshal(it)
		u, err := object(raw)
		if err != nil {
			fail(err.Error())
		}
		v := verdict{Kind: u.GetKind(), Name: u.GetName(), Kstatus: kstatus(u)}
		if h, err := luaHealth(dir, u); err != nil {
			fail(err.Error())
		} else {
			v.Health = h
		}
		if err := out.Encode(v); err != nil {
			fail(err.Error())
		}
	}
}

// object reads JSON with integers as int64, as kstatus needs them (a YAML or float64 decode makes
// status.Compute fail on metadata.generation).
func object(raw []byte) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(raw); err != nil {
		return nil, err
	}
	return u, nil
}

func kstatus(u *unstructured.Unstructured) health {
	r, err := status.Compute(u)
	if err != nil {
		return health{Status: "Error", Message: err.Error()}
	}
	return health{Status: string(r.Status), Message: r.Message}
}

// luaHealth runs DIR/<group>/<Kind>/health.lua on the object, else DIR/<group>/_/health.lua (Argo
// CD's wildcard for every kind of a group); nil when there is neither.
func luaHealth(dir string, u *unstructured.Unstructured) (*health, error) {
	group := u.GroupVersionKind().Group
	var script []byte
	var path string
	for _, kind := range []string{u.GetKind(), "_"} {
		path = filepath.Join(dir, group, kind, "health.lua")
		s, err := os.ReadFile(path)
		if err == nil {
			script = s
			break
		} else if !os.IsNotExist(err) {
			return nil, err
		}
	}
	if script == nil {
		return nil, nil
	}
	h, err := runLua(u.Object, string(script))
	if err != nil {
		return nil, fmt.Errorf("%s on %s/%s: %w", path, u.GetKind(), u.GetName(), err)
	}
	return h, nil
}

// runLua mirrors Argo CD's util/lua VM for a user's script (UseOpenLibs false): a fresh state
// without the standard libraries, then package, base and table, a 1 s timeout, the object as the
// global `obj`; the script returns a table with `status` and `message`.
func runLua(obj map[string]any, script string) (*health, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
	} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", toLua(l, obj))
	if err := l.DoString(script); err != nil {
		return nil, err
	}
	t, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		return nil, fmt.Errorf("the script returned %s, not a table", l.Get(-1).Type())
	}
	h := &health{Status: lua.LVAsString(t.RawGetString("status")), Message: lua.LVAsString(t.RawGetString("message"))}
	switch h.Status {
	case "Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown":
		return h, nil
	}
	return nil, fmt.Errorf("status %q is not one of Argo CD's health statuses", h.Status)
}

// toLua converts decoded JSON as Argo CD's decodeValue does: objects and arrays become tables
// (arrays 1-based), numbers LNumber.
func toLua(l *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(v)
	case string:
		return lua.LString(v)
	case int64:
		return lua.LNumber(v)
	case float64:
		return lua.LNumber(v)
	case map[string]any:
		t := l.NewTable()
		for k, x := range v {
			t.RawSetString(k, toLua(l, x))
		}
		return t
	case []any:
		t := l.NewTable()
		for _, x := range v {
			t.Append(toLua(l, x))
		}
		return t
	}
	return lua.LString(fmt.Sprint(v))
}

// The format of Argo CD's resource_customizations/<group>/<Kind>/health_test.yaml.
type testFile struct {
	Tests []struct {
		HealthStatus health `json:"healthStatus"`
		InputPath    string `json:"inputPath"`
	} `json:"tests"`
}

func runTests(dir string) bool {
	ok, cases := true, 0
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.Name() != "health_test.yaml" {
			return err
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var tf testFile
		if err := yaml.UnmarshalStrict(text, &tf); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		script, err := os.ReadFile(filepath.Join(filepath.Dir(path), "health.lua"))
		if err != nil {
			return err
		}
		for _, tc := range tf.Tests {
			cases++
			input := filepath.Join(filepath.Dir(path), tc.InputPath)
			y, err := os.ReadFile(input)
			if err != nil {
				return err
			}
			j, err := yaml.YAMLToJSON(y)
			if err != nil {
				return fmt.Errorf("%s: %w", input, err)
			}
			u, err := object(j)
			if err != nil {
				return fmt.Errorf("%s: %w", input, err)
			}
			got, err := runLua(u.Object, string(script))
			name := strings.TrimPrefix(input, dir+string(filepath.Separator))
			switch {
			case err != nil:
				ok = false
				fmt.Printf("FAIL %s: %v\n", name, err)
			case *got != tc.HealthStatus:
				ok = false
				fmt.Printf("FAIL %s: got %s %q, want %s %q\n", name, got.Status, got.Message, tc.HealthStatus.Status, tc.HealthStatus.Message)
			default:
				fmt.Printf("ok   %s: %s\n", name, got.Status)
			}
		}
		return nil
	})
	if err != nil {
		fmt.Println("FAIL", err)
		return false
	}
	if cases == 0 {
		fmt.Println("FAIL no health_test.yaml cases under", dir)
		return false
	}
	fmt.Printf("%d case(s)\n", cases)
	return ok
}
