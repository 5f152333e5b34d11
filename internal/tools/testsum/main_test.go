package main

import (
	"strings"
	"testing"
)

// A run of one package with a passing, a skipped, a failing parent with a
// failing subtest, and a test the binary never finished.
const sample = `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestPass"}
{"Action":"output","Package":"p","Test":"TestPass","Output":"    p_test.go:3: hidden\n"}
{"Action":"pass","Package":"p","Test":"TestPass"}
{"Action":"run","Package":"p","Test":"TestSkip"}
{"Action":"output","Package":"p","Test":"TestSkip","Output":"=== RUN   TestSkip\n"}
{"Action":"output","Package":"p","Test":"TestSkip","Output":"    p_test.go:4: needs a thing\n"}
{"Action":"output","Package":"p","Test":"TestSkip","Output":"--- SKIP: TestSkip (0.00s)\n"}
{"Action":"skip","Package":"p","Test":"TestSkip"}
{"Action":"run","Package":"p","Test":"TestFail"}
{"Action":"run","Package":"p","Test":"TestFail/sub"}
{"Action":"output","Package":"p","Test":"TestFail/sub","Output":"=== PAUSE TestFail/sub\n"}
{"Action":"output","Package":"p","Test":"TestFail/sub","Output":"    p_test.go:5: boom\n"}
{"Action":"fail","Package":"p","Test":"TestFail/sub"}
{"Action":"fail","Package":"p","Test":"TestFail"}
{"Action":"run","Package":"p","Test":"TestHang"}
{"Action":"output","Package":"p","Test":"TestHang","Output":"    p_test.go:9: waiting\n"}
{"Action":"output","Package":"p","Output":"panic: test timed out after 1s\n"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t1.0s\n"}
{"Action":"fail","Package":"p"}
`

func TestSummary(t *testing.T) {
	var b strings.Builder
	s := newSummary(&b)
	if err := s.read(strings.NewReader(sample)); err != nil {
		t.Fatal(err)
	}
	if s.finish() {
		t.Error("finish reported success for a failed run")
	}
	out := b.String()
	for _, want := range []string{
		"    p_test.go:5: boom\n",
		"panic: test timed out after 1s\n",
		"FAIL\tp\t1.0s\n",
		"--- UNFINISHED: TestHang (p)",
		"    p_test.go:9: waiting\n",
		"  p TestSkip: p_test.go:4: needs a thing\n",
		"\n1 passed, 3 failed, 1 skipped\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, hidden := range []string{"hidden", "=== PAUSE"} {
		if strings.Contains(out, hidden) {
			t.Errorf("output shows %q:\n%s", hidden, out)
		}
	}
	if !strings.HasSuffix(out, "1 passed, 3 failed, 1 skipped\n") {
		t.Errorf("the summary is not the last line:\n%s", out)
	}
}

func TestSummaryPasses(t *testing.T) {
	var b strings.Builder
	s := newSummary(&b)
	if err := s.read(strings.NewReader(`{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Output":"ok  \tp\t0.1s\n"}
{"Action":"pass","Package":"p"}
`)); err != nil {
		t.Fatal(err)
	}
	if !s.finish() {
		t.Errorf("finish reported a failure:\n%s", b.String())
	}
	if got, want := b.String(), "ok  \tp\t0.1s\n\n1 passed, 0 failed, 0 skipped\n"; got != want {
		t.Errorf("output = %q, want %q", got, want)
	}
}
