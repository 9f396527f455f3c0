package deviceplugin

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

// Candidate is one GPU as the allocation policy sees it for one request.
type Candidate struct {
	// Index is the GPU's index on the node; ties between otherwise equal
	// GPUs go to the lower index, so a preference is deterministic.
	Index int
	// Free lists the device IDs of this GPU's slices that kubelet offers and
	// that are healthy, excluding any in MustIncludeDeviceIDs, in slice order.
	// Slices are taken from the front.
	Free []string
	// Held is how many of the request's MustIncludeDeviceIDs lie on this GPU.
	// They already count towards the request; the policy only places the rest.
	Held int
}

// Choose picks need more device IDs from cands under policy
// (config.PolicyBinpack or config.PolicySpread; "" is binpack) and returns
// them in the order chosen. The result depends only on the free slices, the
// held counts and the GPU indexes, never on the order of cands.
//
// binpack keeps the container on as few GPUs as possible and leaves emptier
// GPUs whole for later, larger requests:
//  1. GPUs that already hold must-include slices are filled first, fullest
//     (fewest free slices) first, since using them adds no GPU;
//  2. what is left goes, whole, onto the one GPU with the fewest free slices
//     that can hold it;
//  3. if no single GPU can, it goes onto the fewest GPUs that can hold it,
//     choosing the fullest GPUs that still allow that number, and filling
//     them fullest first.
//
// spread spreads the container over as many GPUs as it can use, one slice per
// GPU per round: each next slice goes to the GPU that holds the fewest of this
// request's slices so far (must-include slices count), ties going to the GPU
// with the most free slices left. A request for 3 slices on a node whose GPUs
// all have room gets one slice on each of 3 GPUs, the emptiest ones.
func Choose(policy string, cands []Candidate, need int) ([]string, error) {
	if need <= 0 {
		return nil, nil
	}
	free := 0
	for _, c := range cands {
		free += len(c.Free)
	}
	if free < need {
		return nil, fmt.Errorf("%d more slices needed, only %d free healthy slices offered", need, free)
	}
	switch policy {
	case config.PolicyBinpack, "":
		return binpack(cands, need), nil
	case config.PolicySpread:
		return spread(cands, need), nil
	default:
		return nil, fmt.Errorf("unknown allocation policy %q (want %q or %q)", policy, config.PolicyBinpack, config.PolicySpread)
	}
}

// byFullest orders GPUs by fewest free slices, then by index.
func byFullest(a, b *Candidate) int {
	if c := cmp.Compare(len(a.Free), len(b.Free)); c != 0 {
		return c
	}
	return cmp.Compare(a.Index, b.Index)
}

func binpack(cands []Candidate, need int) []string {
	out := make([]string, 0, need)
	take := func(c *Candidate, n int) {
		out = append(out, c.Free[:n]...)
		need -= n
	}

	var held, rest []*Candidate
	for i := range cands {
		c := &cands[i]
		switch {
		case len(c.Free) == 0:
		case c.Held > 0:
			held = append(held, c)
		default:
			rest = append(rest, c)
		}
	}

	// 1. GPUs the container is on already.
	slices.SortStableFunc(held, byFullest)
	for _, c := range held {
		if need == 0 {
			return out
		}
		take(c, min(need, len(c.Free)))
	}
	if need == 0 {
		return out
	}

	// 2. The fullest single GPU that can hold the rest.
	slices.SortStableFunc(rest, byFullest)
	for _, c := range rest {
		if len(c.Free) >= need {
			take(c, need)
			return out
		}
	}

	// 3. The fewest GPUs: k is the smallest number of GPUs whose free slices
	// can hold the rest (the k emptiest). Then pick, fullest first, each GPU
	// that still lets the remaining picks (from the emptiest of the others)
	// hold what is left, so the chosen set is as full as k GPUs allow.
	k, sum := 0, 0
	for i := len(rest) - 1; i >= 0 && sum < need; i-- {
		sum += len(rest[i].Free)
		k++
	}
	picked := make([]bool, len(rest))
	for ; k > 0 && need > 0; k-- {
		for i, c := range rest {
			if picked[i] {
				continue
			}
			// The k-1 emptiest unpicked GPUs other than c.
			others, m := 0, 0
			for j := len(rest) - 1; j >= 0 && m < k-1; j-- {
				if j == i || picked[j] {
					continue
				}
				others += len(rest[j].Free)
				m++
			}
			if len(c.Free)+others >= need {
				picked[i] = true
				take(c, min(need, len(c.Free)))
				break
			}
		}
	}
	return out
}

func spread(cands []Candidate, need int) []string {
	out := make([]string, 0, need)
	taken := make([]int, len(cands)) // slices of this request on each GPU, Held included
	used := make([]int, len(cands))  // slices taken from Free
	for i, c := range cands {
		taken[i] = c.Held
	}
	for ; need > 0; need-- {
		best := -1
		for i, c := range cands {
			if used[i] == len(c.Free) {
				continue
			}
			if best < 0 {
				best = i
				continue
			}
			left, bestLeft := len(c.Free)-used[i], len(cands[best].Free)-used[best]
			switch {
			case taken[i] < taken[best],
				taken[i] == taken[best] && left > bestLeft,
				taken[i] == taken[best] && left == bestLeft && c.Index < cands[best].Index:
				best = i
			}
		}
		out = append(out, cands[best].Free[used[best]])
		used[best]++
		taken[best]++
	}
	return out
}
