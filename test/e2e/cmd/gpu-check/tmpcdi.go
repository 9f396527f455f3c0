package main

import (
	"fmt"
	"os"
	"path/filepath"
)

// TEMPORARY (not committed): a CDI spec for the fake root until generate lands.
func writeTmpCDI(dir, root string) error {
	if os.Getenv("GPU_CHECK_TMP_CDI") == "" {
		return nil
	}
	lib := root + "/usr/local/nvidia/lib64"
	spec := fmt.Sprintf(`cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
- name: %s
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
      hostPath: %s/dev/nvidia0
containerEdits:
  deviceNodes:
  - path: /dev/nvidiactl
    hostPath: %s/dev/nvidiactl
  mounts:
  - {hostPath: %s/libcuda.so.580.159.04, containerPath: /usr/local/nvidia/lib64/libcuda.so.1, options: [ro, bind]}
  - {hostPath: %s/libnvidia-ml.so.580.159.04, containerPath: /usr/local/nvidia/lib64/libnvidia-ml.so.1, options: [ro, bind]}
`, simGPU.UUID, root, root, lib, lib)
	return os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(spec), 0o644)
}
