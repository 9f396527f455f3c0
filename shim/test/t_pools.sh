# Tests of stream-ordered pools, CUDA 13 pools by location and the pre-3.2
# allocation ABIs (sourced by run.sh; uses its setup/run/used/expect helpers).

# held NAME ARGS... — runs cudaprog ARGS in the background until it touches
# $T/NAME.held, then leaves it waiting for $T/NAME.go.
held() {
	local name=$1
	shift
	LD_PRELOAD=$SHIM timeout 60 "$PROG" "$@" touch:"$T/$name.held" waitfile:"$T/$name.go" >"$T/out" 2>"$T/err" &
	waitfor "$T/$name.held" $!
}

# release NAME — lets a held program go on, and waits for it to finish.
release() {
	touch "$T/$1.go"
	wait
}

test_pool_release_threshold() {
	local m
	for m in "-m direct" "-m rt12 -p" "-m rt11"; do
		setup $((64 * MiB))
		# A pool that keeps what is freed (PyTorch, TensorFlow, RAPIDS set UINT64_MAX): the
		# freed 32 MiB stay reserved through a synchronisation and the container is charged
		# for them; what the pool attribute says is what the region says.
		# shellcheck disable=SC2086
		held keep $m init threshold:max async:32MiB free sync poolattr:reserved:32MiB poolattr:used:0
		expect "$m used while the pool keeps 32 MiB" "$(used)" $((32 * MiB))
		release keep
		# What the pool keeps serves the next allocation without a new charge, even with the
		# quota full; one byte more than the quota is refused.
		# shellcheck disable=SC2086
		run $m init threshold:max async:48MiB free async:48MiB alloc:16MiB alloc:1:2 async:1:2
		# Threshold 0 (the default): the pool keeps the block until the next synchronisation.
		# shellcheck disable=SC2086
		held before $m init async:32MiB free
		expect "$m used after the free, before a sync" "$(used)" $((32 * MiB))
		release before
		# shellcheck disable=SC2086
		held after $m init async:32MiB free sync
		expect "$m used after the free and a sync" "$(used)" 0
		release after
		# cuMemPoolTrimTo gives back what the pool keeps, down to what is asked.
		# shellcheck disable=SC2086
		held trim $m init threshold:max async:32MiB free trim:16MiB poolattr:reserved:16MiB
		expect "$m used after trimming to 16 MiB" "$(used)" $((16 * MiB))
		release trim
		# Over the quota, pools give back what they keep unused before anything is refused.
		# shellcheck disable=SC2086
		run $m init threshold:max async:64MiB free alloc:64MiB poolattr:reserved:0 alloc:1:2
		# A pool that grows by more than asked (32 MiB grains here) is charged what it reserves.
		# shellcheck disable=SC2086
		FAKECUDA_POOL_GRAIN=$((32 * MiB)) held grain $m init async:1MiB poolattr:reserved:32MiB
		expect "$m used by a pool grown by a 32 MiB grain" "$(used)" $((32 * MiB))
		release grain
		# A pool destroyed with an allocation out keeps its memory until that is freed.
		# shellcheck disable=SC2086
		held destroyed $m init poolcreate:0 pool:16MiB pooldestroy
		expect "$m used by a destroyed pool with 16 MiB out" "$(used)" $((16 * MiB))
		release destroyed
		# shellcheck disable=SC2086
		held gone $m init poolcreate:0 pool:16MiB pooldestroy free
		expect "$m used after its last allocation is freed" "$(used)" 0
		release gone
	done
}

test_pool_sync_points() {
	local m k
	for m in "-m direct" "-m rt12" "-m rt12 -p" "-m rt11"; do
		for k in sync ctxsync2 streamsync "stream streamsync"; do
			setup $((64 * MiB))
			# shellcheck disable=SC2086
			held sync $m init $k async:16MiB pool:16MiB free free $k
			expect "$m $k: used after the frees and a sync" "$(used)" 0
			release sync
		done
	done
}

test_pool_attributes() {
	setup $((64 * MiB))
	# 10 MiB, then 5 MiB more that the pool cannot serve (grows by 6 MiB: whole 2 MiB pages),
	# then 5 MiB back: the pool reserves 16 MiB and uses 10 MiB; 16 MiB is charged.
	held attr init threshold:max async:10MiB async:5MiB free poolattr:reserved:16MiB poolattr:used:10MiB \
		poolattr:reservedhigh:16MiB poolattr:usedhigh:15MiB
	expect "used" "$(used)" $((16 * MiB))
	release attr
}

test_location_pools() {
	local m
	for m in "-m direct" "-m rt12"; do
		setup
		limits2 $((64 * MiB)) $((32 * MiB))
		# Host, host-NUMA and host-preferred managed pools are not GPU memory: nothing
		# charged, the whole quota still there.
		# shellcheck disable=SC2086
		run $m init locpool:default:2:0:1 pool:128MiB alloc:64MiB alloc:1:2
		# shellcheck disable=SC2086
		run $m init locpool:current:3:0:1 pool:128MiB alloc:64MiB alloc:1:2
		# shellcheck disable=SC2086
		run $m init locpool:default:2:0:2 pool:128MiB alloc:64MiB alloc:1:2
		# shellcheck disable=SC2086
		run $m init poolcreateat:2:0:1 pool:128MiB alloc:64MiB alloc:1:2
		# A device location charges that device (GPU 1, 32 MiB), not the current one.
		# shellcheck disable=SC2086
		run $m init locpool:default:1:1:1 pool:32MiB pool:1:2 alloc:64MiB
		# shellcheck disable=SC2086
		run $m init locpool:current:1:1:2 pool:32MiB pool:1:2 alloc:64MiB
		# A managed pool with no preferred location counts on the stream's device.
		# shellcheck disable=SC2086
		run $m init locpool:default:0:0:2 pool:64MiB pool:1:2 alloc:1:2
		# cuMemSetMemPool: GPU 1's current pool is one made there; cuMemAllocAsync on a
		# stream of GPU 1 takes from it and GPU 1 is charged.
		# shellcheck disable=SC2086
		run $m init poolcreateat:1:1:1 locpool:set:1:1:1 ctx:1 stream ctx:0 async:32MiB async:1:2 alloc:64MiB
		# A pool of the wrong location is refused by the driver, as before.
		# shellcheck disable=SC2086
		run $m init poolcreateat:1:1:1 locpool:set:1:0:1:1
	done
}

test_legacy_entry_points() {
	local m k
	for m in "-m direct" "-m rt12" "-m rt11"; do
		setup $((64 * MiB))
		# The pre-3.2 ABIs (cuGetProcAddress at 2000 outside direct mode) fill the quota like
		# their _v2 twins and their frees (either ABI) give it back.
		for k in "lalloc:64MiB" "lpitch:1000:65536" "larray:4096:4096" "larray3d:1024:1024:16"; do
			# shellcheck disable=SC2086
			run $m init "$k" alloc:1:2 lalloc:1:2 free alloc:64MiB free
			expect "$m $k used after free" "$(used)" 0
		done
		# shellcheck disable=SC2086
		run $m init lalloc:32MiB lalloc:32MiB alloc:1:2 lfree lfree alloc:64MiB
		# shellcheck disable=SC2086
		held legacy $m init lalloc:48MiB
		expect "$m used while a legacy allocation is held" "$(used)" $((48 * MiB))
		release legacy
	done
}

test_pool_table_full() {
	setup $((64 * MiB))
	# More pools than the shim keeps (256): the ones past that are counted per allocation on
	# the stream's device, never let through uncounted.
	local ops=() i
	for i in $(seq 300); do ops+=(poolcreate:0); done
	run init "${ops[@]}" pool:64MiB pool:1:2 alloc:1:2 free alloc:64MiB
}

test_pool_without_attributes() {
	local m
	for m in "-m direct" "-m rt12 -p"; do
		setup $((64 * MiB))
		export FAKECUDA_POOL_NOATTR=1
		# A driver that cannot say what a pool reserves (before 11.3): what is allocated from
		# the pool is charged, as any allocation, and a free gives it back.
		# shellcheck disable=SC2086
		run $m init async:64MiB async:1:2 alloc:1:2 free async:64MiB
		# shellcheck disable=SC2086
		held noattr $m init async:24MiB pool:16MiB
		expect "$m used" "$(used)" $((40 * MiB))
		release noattr
		unset FAKECUDA_POOL_NOATTR
	done
}

test_external_memory() {
	local m
	for m in "-m direct" "-m rt12" "-m rt11"; do
		setup $((64 * MiB))
		# An import holds another API's memory until it is destroyed: charged its size on the
		# current GPU. A buffer mapped from it is a view: its cuMemFree gives nothing back.
		# shellcheck disable=SC2086
		run $m init extimport:48MiB alloc:16MiB alloc:1:2 extmap:48MiB free alloc:1:2 extdestroy alloc:48MiB
		# Over the quota the import is refused, and nothing stays charged.
		# shellcheck disable=SC2086
		run $m init extimport:65MiB:2 alloc:64MiB
		# shellcheck disable=SC2086
		held ext $m init extimport:40MiB
		expect "$m used while imported" "$(used)" $((40 * MiB))
		release ext
	done
}

test_multicast_binds() {
	local m
	for m in "-m direct" "-m rt12" "-m rt11"; do
		setup $((64 * MiB))
		# A cuMemCreate allocation bound to a multicast object lives until it is unbound, even
		# after its handle is released; an unbind of another device leaves it bound.
		# shellcheck disable=SC2086
		run $m init create:0:64MiB mccreate:64MiB mcbind:64MiB free alloc:1:2 mcunbind:1:64MiB alloc:1:2 \
			mcunbind:0:64MiB alloc:64MiB
		# shellcheck disable=SC2086
		run $m init create:0:64MiB mccreate:64MiB mcbind2:0:64MiB free alloc:1:2 mcunbind:0:64MiB alloc:64MiB
		# Bound by address, then unmapped and released: still held by the bind.
		# shellcheck disable=SC2086
		run $m init create:0:64MiB map:64MiB mccreate:64MiB mcbindaddr:64MiB unmap:64MiB free alloc:1:2 \
			mcunbind:0:64MiB alloc:64MiB
		# shellcheck disable=SC2086
		run $m init create:0:64MiB map:64MiB mccreate:64MiB mcbindaddr2:0:64MiB unmap:64MiB free alloc:1:2 \
			mcunbind:0:64MiB alloc:64MiB
		# Unbound before the release: freed at the release, as before.
		# shellcheck disable=SC2086
		run $m init create:0:64MiB mccreate:64MiB mcbind:64MiB mcunbind:0:64MiB alloc:1:2 free alloc:64MiB
		expect "$m used" "$(used)" 0
	done
}

test_ipc_imports() {
	local m
	for m in "-m direct" "-m rt12" "-m rt11"; do
		setup $((64 * MiB))
		# The exporter holds 16 MiB and a pool block of 8 MiB. A second process of the container
		# that opens the 16 MiB with cuIpcOpenMemHandle and imports the pool block with
		# cuMemPoolImportPointer is charged both too (the driver keeps the memory while an import
		# is open, whatever the exporter does): 48 MiB, so 16 more fill the quota. Freeing that and
		# the pool import (cuMemFreeAsync) gives 24 back; closing the IPC import 16 more.
		# shellcheck disable=SC2086
		held exporter $m init alloc:16MiB ipcexport:"$T/h" async:8MiB poolexport:"$T/ph"
		# shellcheck disable=SC2086
		run $m init ipcopen:"$T/h" poolimport:"$T/ph" alloc:16MiB alloc:1:2 free free alloc:24MiB alloc:1:2 \
			ipcclose alloc:16MiB alloc:1:2
		expect "$m used once the importer is gone" "$(used)" $((24 * MiB))
		release exporter
	done
}

test_ipc_import_footprint() {
	# The importer's context footprint (8 MiB each) is what NVML shows for it beyond what it
	# counts; its IPC import is counted but in the exporter's NVML figure, so it is left out of
	# that comparison: after two measures (a module load, then an allocation) the footprint is
	# still 8 MiB, not 8 - 16 = 0. Exporter 8 + 16, importer 8 + 16 + 1 + 77: 126 of 128 MiB,
	# so 4 MiB more are refused (with the footprint lost they would fit). Not filled to the byte:
	# the exporter's unused lease chunk may not be back yet.
	setup $((128 * MiB))
	export FAKECUDA_CTX_BYTES=$((8 * MiB)) FAKECUDA_MODULE_BYTES=0
	held exporter init alloc:16MiB ipcexport:"$T/h"
	run init ipcopen:"$T/h" modload:data alloc:1MiB alloc:77MiB alloc:4MiB:2 || { release exporter; return 1; }
	release exporter
}

test_ipc_free_while_imported() {
	# The way past the quota that charging only the exporter left open: allocate, export, import
	# in a sibling, free in the exporter (the driver keeps the memory for the import), allocate
	# again. The second import would make 96 MiB resident on a 64 MiB quota: refused, and
	# closed again.
	setup $((64 * MiB))
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init waitfile:"$T/h1.ready" ipcopen:"$T/h1" touch:"$T/opened" \
		waitfile:"$T/h2.ready" ipcopen:"$T/h2":2 touch:"$T/tried" waitfile:"$T/end" >"$T/imp.out" 2>"$T/imp.err" &
	local imp=$!
	run init alloc:32MiB ipcexport:"$T/h1" touch:"$T/h1.ready" waitfile:"$T/opened" free alloc:32MiB \
		ipcexport:"$T/h2" touch:"$T/h2.ready" waitfile:"$T/tried" || { touch "$T/end"; wait $imp; return 1; }
	touch "$T/end"
	wait $imp || { cat "$T/imp.out" "$T/imp.err"; return 1; }
	expect "importer's refusal" "$(grep -c 'quota exceeded' "$T/imp.err")" 1
}

test_pool_import_free_while_imported() {
	# The same way past the quota with a stream-ordered pool: allocate from the pool, export the
	# pointer, import it in a sibling, free it in the exporter and trim the pool, allocate again.
	# The driver requires the importer to free first; nothing makes a tenant do so. The second
	# import would make 96 MiB resident on a 64 MiB quota: refused, and freed again.
	setup $((64 * MiB))
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init waitfile:"$T/h1.ready" poolimport:"$T/h1" touch:"$T/opened" \
		waitfile:"$T/h2.ready" poolimport:"$T/h2":2 touch:"$T/tried" waitfile:"$T/end" >"$T/imp.out" 2>"$T/imp.err" &
	local imp=$!
	run init async:32MiB poolexport:"$T/h1" touch:"$T/h1.ready" waitfile:"$T/opened" free sync trim:0 \
		async:32MiB poolexport:"$T/h2" touch:"$T/h2.ready" waitfile:"$T/tried" || { touch "$T/end"; wait $imp; return 1; }
	touch "$T/end"
	wait $imp || { cat "$T/imp.out" "$T/imp.err"; return 1; }
	expect "importer's refusal" "$(grep -c 'quota exceeded' "$T/imp.err")" 1
}

test_ipc_share_script() {
	# validate/ipcshare.py, which check 10 of validate.sh runs on a GPU, run here on the fake
	# driver: both ways of sharing a block run to the end, and the shim's figures in the
	# importer are those check 10 judges by (the import charged while shared and after the
	# exporter's free, given back at the close).
	command -v python3 >/dev/null || { echo "    info: no python3: skipped"; return 0; }
	local mode blk=$((16 * MiB)) d
	for mode in ipc pool; do
		setup $((64 * MiB))
		d=$T/w
		mkdir "$d"
		LD_PRELOAD=$SHIM timeout 60 python3 "$HERE/../validate/ipcshare.py" $mode export "$d" $blk >"$T/exp.out" 2>&1 &
		local e=$!
		LD_PRELOAD=$SHIM timeout 60 python3 "$HERE/../validate/ipcshare.py" $mode import "$d" $blk >"$T/imp.out" 2>&1 &
		local i=$!
		waitfor "$d/opened" $i
		touch "$d/go_free"
		waitfor "$d/measured" $i
		touch "$d/go_close"
		waitfor "$d/closed" $i
		touch "$d/done"
		wait $e && wait $i || { cat "$T/exp.out" "$T/imp.out"; return 1; }
		# The container's used, as the importer's cuMemGetInfo says: both charged while shared.
		expect "$mode: used while shared" "$(cat "$d/opened")" $((2 * blk))
		expect "$mode: used after the exporter's free" "$(cat "$d/measured")" $blk
		expect "$mode: used after the close" "$(cat "$d/closed")" 0
	done
}

t pool_release_threshold test_pool_release_threshold
t pool_sync_points test_pool_sync_points
t pool_attributes test_pool_attributes
t location_pools test_location_pools
t legacy_entry_points test_legacy_entry_points
t pool_without_attributes test_pool_without_attributes
t pool_table_full test_pool_table_full
t ipc_imports test_ipc_imports
t pool_import_free_while_imported test_pool_import_free_while_imported
t ipc_share_script test_ipc_share_script
t ipc_free_while_imported test_ipc_free_while_imported
t ipc_import_footprint test_ipc_import_footprint
t external_memory test_external_memory
t multicast_binds test_multicast_binds
