// Throwaway test helper (tests/chart/test_argocd_health.py builds it into the trainop cache).
module trainop.local/argocd-lua

go 1.24

// The gopher-lua version Argo CD v3.5 embeds (its go.mod).
require github.com/yuin/gopher-lua v1.1.2
