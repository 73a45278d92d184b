package fakeapi

import (
	"fmt"
	"strings"
)

// ControlUsage documents the control routes of the fake c, /_stats and
// /_faults, for the -h of a command that runs it.
func (c Config) ControlUsage() string {
	a := c.Action
	stats := append(append([]string{"requests"}, c.Counts...), "replays", "conflicts", "faults_injected")
	faults := [][2]string{
		{"fail_before_" + a + " N", "the next N " + a + "s answer 500 without executing;\na retry with the same key executes"},
		{"timeout_after_" + a + " N", "the next N " + a + "s execute, then the connection\ndrops mid-answer; a retry with the key replays the answer"},
		{"fail_before_" + a + "_rate P", "probability (0 to 1) of a failure before any other " + a},
		{"timeout_after_" + a + "_rate P", "probability of a drop after any other " + a},
		{"delay_ms MS", "added to every API request (the key is held meanwhile)"},
	}
	var b strings.Builder
	fmt.Fprintf(&b, "  GET  /_stats   %s\n", strings.Join(stats, ", "))
	b.WriteString("  GET  /_faults  the faults still planned\n")
	b.WriteString("  POST /_faults  plan faults, as JSON; fields left out keep their value, 0 clears:\n")
	width := len(faults[3][0])
	for _, f := range faults {
		indent := "\n      " + strings.Repeat(" ", width)
		fmt.Fprintf(&b, "    %-*s  %s\n", width, f[0], strings.ReplaceAll(f[1], "\n", indent))
	}
	return b.String()
}
