// Command porcupine checks `stateplane run --history` files of `counter` (docs/REPLICATION.md,
// *Histories*) with Porcupine, a linearizability checker that is no part of this project:
// the "small conversion" that document speaks of. Each packet is an operation of its flow
// (Porcupine's partitions: linearizability is local); its input is its length on the wire;
// its output the flow's packets and bytes after it, from the `state` of its return line
// (counter's entry: an action byte, then packets and bytes, 16 bytes each, little-endian),
// or nothing where the state was not recorded. A packet with no return line may or may not
// have taken effect: it returns at the end of time with an output any state agrees with,
// as Jepsen takes an operation whose outcome is unknown.
//
//	go run . HISTORY.jsonl [MORE.jsonl ...]
//
// Prints the flows and packets read and Porcupine's verdict; exits 1 unless it is Ok.
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/anishathalye/porcupine"
)

// counts is a flow's state: its packets and bytes.
type counts struct{ packets, bytes uint64 }

// line is one line of a history; absent fields stay nil.
type line struct {
	Op       string  `json:"op"`
	Flow     *string `json:"flow"`
	CallNs   *int64  `json:"call_ns"`
	Len      *uint64 `json:"len"`
	ReturnNs *int64  `json:"return_ns"`
	State    *string `json:"state"`
}

type call struct {
	flow string
	len  uint64
	at   int64
}

type ret struct {
	at    int64
	shown *counts
}

// shown reads a return line's state: nil where it was not recorded.
func shown(state *string) (*counts, error) {
	if state == nil {
		return nil, nil
	}
	if *state == "" {
		return &counts{}, nil
	}
	b, err := hex.DecodeString(*state)
	if err != nil || len(b) < 33 {
		return nil, fmt.Errorf("state %q is not counter's entry", *state)
	}
	return &counts{binary.LittleEndian.Uint64(b[1:9]), binary.LittleEndian.Uint64(b[17:25])}, nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: porcupine HISTORY.jsonl [MORE.jsonl ...]")
		os.Exit(2)
	}
	calls := map[string]call{}
	returns := map[string]ret{}
	for _, path := range os.Args[1:] {
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		scanner := bufio.NewScanner(f)
		scanner.Buffer(make([]byte, 1<<20), 1<<26)
		for n := 1; scanner.Scan(); n++ {
			var l line
			if err := json.Unmarshal(scanner.Bytes(), &l); err != nil {
				// A process killed mid-line leaves its last line cut short.
				fmt.Fprintf(os.Stderr, "%s: line %d left out: %v\n", path, n, err)
				continue
			}
			switch {
			case l.CallNs != nil && l.Flow != nil && l.Len != nil:
				calls[l.Op] = call{*l.Flow, *l.Len, *l.CallNs}
			case l.ReturnNs != nil:
				s, err := shown(l.State)
				if err != nil {
					fmt.Fprintf(os.Stderr, "%s: line %d: %v\n", path, n, err)
					os.Exit(2)
				}
				returns[l.Op] = ret{*l.ReturnNs, s}
			}
		}
		f.Close()
	}
	var history []porcupine.Operation
	flows := map[string]bool{}
	open := 0
	for op, c := range calls {
		o := porcupine.Operation{Input: c, Call: c.at, Return: math.MaxInt64, Output: (*counts)(nil)}
		if r, ok := returns[op]; ok {
			o.Return, o.Output = r.at, r.shown
			delete(returns, op)
		} else {
			open++
		}
		flows[c.flow] = true
		history = append(history, o)
	}
	if len(returns) > 0 {
		fmt.Fprintf(os.Stderr, "%d returns with no call\n", len(returns))
		os.Exit(1)
	}
	model := porcupine.Model{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			by := map[string][]porcupine.Operation{}
			for _, o := range h {
				f := o.Input.(call).flow
				by[f] = append(by[f], o)
			}
			var parts [][]porcupine.Operation
			for _, p := range by {
				parts = append(parts, p)
			}
			return parts
		},
		Init: func() interface{} { return counts{} },
		Step: func(state, input, output interface{}) (bool, interface{}) {
			s := state.(counts)
			next := counts{s.packets + 1, s.bytes + input.(call).len}
			shown := output.(*counts)
			return shown == nil || *shown == next, next
		},
	}
	verdict := porcupine.CheckOperationsTimeout(model, history, 5*time.Minute)
	fmt.Printf("%d flows, %d packets (%d without output): %s\n", len(flows), len(history), open,
		map[porcupine.CheckResult]string{porcupine.Ok: "linearizable", porcupine.Illegal: "NOT linearizable", porcupine.Unknown: "unknown (timed out)"}[verdict])
	if verdict != porcupine.Ok {
		os.Exit(1)
	}
}
