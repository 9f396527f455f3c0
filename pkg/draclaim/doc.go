// Package draclaim holds what the DRA driver and the NRI plugin agree on
// about a claim (Contract 8): the marker mount that tells the NRI plugin
// which claim and devices a container was given, the claim UIDs and device
// names a marker may carry, and the error of a rejected claim.
package draclaim
