// argocd-lua runs Argo CD resource health checks in gopher-lua, the interpreter Argo CD embeds, with the
// sandbox Argo CD gives custom checks from argocd-cm: only the package, base and table libraries and an
// os library reduced to time and date (no string, no math, no io), a one-second deadline, and the object
// as the global `obj`.
//
// It mirrors util/lua's runLua and decodeValue (Argo CD v3.5) without importing Argo CD, whose module
// pulls in half of Kubernetes. Used by tests/chart/test_argocd_health.py:
//
//	stdin:  {"script": "<lua>", "objects": [<object>, ...]}
//	stdout: [{"status": "...", "message": "..."} | {"status": "", "message": "", "error": "..."}, ...]
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	lua "github.com/yuin/gopher-lua"
)

type request struct {
	Script  string           `json:"script"`
	Objects []map[string]any `json:"objects"`
}

type result struct {
	Status  string `json:"status"`
	Message string `json:"message"`
	Error   string `json:"error,omitempty"`
}

func openSafeOs(l *lua.LState) int {
	lua.OpenOs(l)
	full := l.GetGlobal(lua.OsLibName).(*lua.LTable)
	safe := l.NewTable()
	for _, name := range []string{"time", "date"} {
		safe.RawSetString(name, full.RawGetString(name))
	}
	l.SetGlobal(lua.OsLibName, safe)
	l.Push(safe)
	return 1
}

func decodeValue(l *lua.LState, value any) lua.LValue {
	switch converted := value.(type) {
	case bool:
		return lua.LBool(converted)
	case float64:
		return lua.LNumber(converted)
	case string:
		return lua.LString(converted)
	case []any:
		arr := l.CreateTable(len(converted), 0)
		for _, item := range converted {
			arr.Append(decodeValue(l, item))
		}
		return arr
	case map[string]any:
		tbl := l.CreateTable(0, len(converted))
		for key, item := range converted {
			tbl.RawSetH(lua.LString(key), decodeValue(l, item))
		}
		return tbl
	}
	return lua.LNil
}

func run(script string, obj map[string]any) result {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.OsLibName, openSafeOs},
	} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			return result{Error: err.Error()}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", decodeValue(l, obj))
	if err := l.DoString(script); err != nil {
		return result{Error: err.Error()}
	}
	returned, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		return result{Error: fmt.Sprintf("expect table output from Lua script, not %s", l.Get(-1).Type())}
	}
	return result{
		Status:  lua.LVAsString(returned.RawGetString("status")),
		Message: lua.LVAsString(returned.RawGetString("message")),
	}
}

func main() {
	var req request
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		fmt.Fprintln(os.Stderr, "argocd-lua: bad request:", err)
		os.Exit(2)
	}
	results := make([]result, 0, len(req.Objects))
	for _, obj := range req.Objects {
		results = append(results, run(req.Script, obj))
	}
	if err := json.NewEncoder(os.Stdout).Encode(results); err != nil {
		fmt.Fprintln(os.Stderr, "argocd-lua:", err)
		os.Exit(1)
	}
}
