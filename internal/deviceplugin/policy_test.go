package deviceplugin

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

// ids returns "<g>::<from>" .. "<g>::<to-1>".
func ids(g string, from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("%s::%d", g, i))
	}
	return out
}

// cand is a GPU with index i whose free slices are g::0..g::free-1.
func cand(i int, g string, free, held int) Candidate {
	return Candidate{Index: i, Free: ids(g, 0, free), Held: held}
}

func TestChoose(t *testing.T) {
	cat := func(parts ...[]string) []string { return slices.Concat(parts...) }
	tests := []struct {
		name   string
		policy string
		cands  []Candidate
		need   int
		want   []string
		err    string
	}{
		{
			name:   "binpack: the fullest GPU that holds the whole request",
			policy: config.PolicyBinpack,
			cands:  []Candidate{cand(0, "A", 10, 0), cand(1, "B", 3, 0), cand(2, "C", 5, 0)},
			need:   4,
			want:   ids("C", 0, 4),
		},
		{
			name:   "binpack: an exact fit wins",
			policy: config.PolicyBinpack,
			cands:  []Candidate{cand(0, "A", 10, 0), cand(1, "B", 3, 0), cand(2, "C", 5, 0)},
			need:   3,
			want:   ids("B", 0, 3),
		},
		{
			name:   "binpack: default policy is binpack",
			policy: "",
			cands:  []Candidate{cand(0, "A", 10, 0), cand(1, "B", 3, 0)},
			need:   2,
			want:   ids("B", 0, 2),
		},
		{
			name:   "binpack: ties go to the lower index",
			policy: config.PolicyBinpack,
			cands:  []Candidate{cand(0, "A", 5, 0), cand(1, "B", 5, 0), cand(2, "C", 5, 0)},
			need:   2,
			want:   ids("A", 0, 2),
		},
		{
			name:   "binpack: fewest GPUs, fullest set, fullest first",
			policy: config.PolicyBinpack,
			cands:  []Candidate{cand(0, "A", 3, 0), cand(1, "B", 8, 0), cand(2, "C", 10, 0)},
			need:   12,
			// Two GPUs are needed; {A, C} holds 12 and leaves B whole.
			want: cat(ids("A", 0, 3), ids("C", 0, 9)),
		},
		{
			name:   "binpack: fewest GPUs even when small GPUs could be filled",
			policy: config.PolicyBinpack,
			cands:  []Candidate{cand(0, "A", 2, 0), cand(1, "B", 2, 0), cand(2, "C", 2, 0), cand(3, "D", 6, 0)},
			need:   7,
			want:   cat(ids("A", 0, 2), ids("D", 0, 5)),
		},
		{
			name:   "binpack: every GPU",
			policy: config.PolicyBinpack,
			cands:  []Candidate{cand(0, "A", 2, 0), cand(1, "B", 1, 0)},
			need:   3,
			want:   cat(ids("B", 0, 1), ids("A", 0, 2)),
		},
		{
			name:   "binpack: must-include GPU is filled first",
			policy: config.PolicyBinpack,
			cands:  []Candidate{cand(0, "A", 2, 0), cand(1, "B", 4, 1), cand(2, "C", 10, 0)},
			need:   3,
			want:   ids("B", 0, 3),
		},
		{
			name:   "binpack: the rest after the must-include GPU is packed",
			policy: config.PolicyBinpack,
			cands:  []Candidate{cand(0, "A", 2, 0), cand(1, "B", 4, 1), cand(2, "C", 10, 0)},
			need:   6,
			want:   cat(ids("B", 0, 4), ids("A", 0, 2)),
		},
		{
			name:   "binpack: GPUs without free slices are skipped",
			policy: config.PolicyBinpack,
			cands:  []Candidate{cand(0, "A", 0, 0), cand(1, "B", 0, 2), cand(2, "C", 4, 0)},
			need:   1,
			want:   ids("C", 0, 1),
		},
		{
			name:   "spread: one slice per GPU, emptiest first",
			policy: config.PolicySpread,
			cands:  []Candidate{cand(0, "A", 10, 0), cand(1, "B", 3, 0), cand(2, "C", 5, 0)},
			need:   3,
			want:   []string{"A::0", "C::0", "B::0"},
		},
		{
			name:   "spread: a second round goes to the emptiest again",
			policy: config.PolicySpread,
			cands:  []Candidate{cand(0, "A", 10, 0), cand(1, "B", 3, 0), cand(2, "C", 5, 0)},
			need:   5,
			want:   []string{"A::0", "C::0", "B::0", "A::1", "C::1"},
		},
		{
			name:   "spread: ties go to the lower index",
			policy: config.PolicySpread,
			cands:  []Candidate{cand(0, "A", 4, 0), cand(1, "B", 4, 0)},
			need:   1,
			want:   []string{"A::0"},
		},
		{
			name:   "spread: must-include slices count",
			policy: config.PolicySpread,
			cands:  []Candidate{cand(0, "A", 4, 1), cand(1, "B", 3, 0)},
			need:   2,
			want:   []string{"B::0", "A::0"},
		},
		{
			name:   "spread: a full GPU is skipped",
			policy: config.PolicySpread,
			cands:  []Candidate{cand(0, "A", 1, 0), cand(1, "B", 0, 0), cand(2, "C", 1, 0)},
			need:   2,
			want:   []string{"A::0", "C::0"},
		},
		{
			name:   "nothing needed",
			policy: config.PolicyBinpack,
			cands:  []Candidate{cand(0, "A", 1, 0)},
			need:   0,
			want:   nil,
		},
		{
			name:   "not enough free slices",
			policy: config.PolicyBinpack,
			cands:  []Candidate{cand(0, "A", 1, 0), cand(1, "B", 2, 0)},
			need:   4,
			err:    "4 more slices needed, only 3 free",
		},
		{
			name:   "unknown policy",
			policy: "roundrobin",
			cands:  []Candidate{cand(0, "A", 1, 0)},
			need:   1,
			err:    `unknown allocation policy "roundrobin"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Choose(tt.policy, tt.cands, tt.need)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Choose() error = %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Choose(): %v", err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Choose() = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestChooseProperties checks, over many shapes of free slices, what every
// preference must satisfy: the right number of distinct offered IDs, and
// for binpack no more GPUs than the fewest that can hold the request.
func TestChooseProperties(t *testing.T) {
	shapes := [][]int{{1}, {4, 4}, {1, 2, 3, 4}, {0, 7, 1, 9}, {64, 64, 64, 64, 64, 64, 64, 64}, {5, 0, 5, 0, 3}}
	for _, shape := range shapes {
		total := 0
		for _, n := range shape {
			total += n
		}
		// Every size on small shapes; about 64 sizes on large ones.
		for need := 1; need <= total; need += max(1, total/64) {
			for _, policy := range []string{config.PolicyBinpack, config.PolicySpread} {
				var cands []Candidate
				offered := map[string]int{}
				for i, n := range shape {
					g := string(rune('A' + i))
					cands = append(cands, cand(i, g, n, 0))
					for _, id := range ids(g, 0, n) {
						offered[id] = i
					}
				}
				got, err := Choose(policy, cands, need)
				if err != nil {
					t.Fatalf("%s %v need %d: %v", policy, shape, need, err)
				}
				reversed := slices.Clone(cands)
				slices.Reverse(reversed)
				if again, _ := Choose(policy, reversed, need); !slices.Equal(again, got) {
					t.Fatalf("%s %v need %d: %v, but %v with the GPUs listed in reverse", policy, shape, need, got, again)
				}
				if len(got) != need {
					t.Fatalf("%s %v need %d: got %d IDs", policy, shape, need, len(got))
				}
				seen := map[string]bool{}
				gpus := map[int]bool{}
				for _, id := range got {
					i, ok := offered[id]
					if !ok || seen[id] {
						t.Fatalf("%s %v need %d: %q not offered or chosen twice in %v", policy, shape, need, id, got)
					}
					seen[id] = true
					gpus[i] = true
				}
				if policy == config.PolicyBinpack {
					sorted := slices.Clone(shape)
					slices.Sort(sorted)
					fewest, sum := 0, 0
					for i := len(sorted) - 1; sum < need; i-- {
						sum += sorted[i]
						fewest++
					}
					if len(gpus) != fewest {
						t.Errorf("binpack %v need %d: %d GPUs used, the fewest is %d (%v)", shape, need, len(gpus), fewest, got)
					}
				}
				if policy == config.PolicySpread {
					nonEmpty := 0
					for _, n := range shape {
						if n > 0 {
							nonEmpty++
						}
					}
					if want := min(need, nonEmpty); len(gpus) < want {
						t.Errorf("spread %v need %d: %d GPUs used, want at least %d (%v)", shape, need, len(gpus), want, got)
					}
				}
			}
		}
	}
}
