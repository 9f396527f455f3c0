// Package quantity parses and prints the amounts people write in the config
// and in Docker requests: bytes of memory ("4GiB", "25%" of a GPU) and
// percent of SM time.
package quantity
