#!/usr/bin/env bash
# v1 reclaim of a frozen cgroup (zram swap of its own, removed after): memory.force_empty
# against lowering memory.limit_in_bytes to 4 MiB and back. Needs root, a v1 memory
# and freezer hierarchy, an unused zram0. Figures: docs/performance.md (Hibernation).
set -u
if [ "$(cat /sys/block/zram0/disksize)" != 0 ] || [ "$(wc -l < /proc/swaps)" -gt 1 ]; then
    echo "zram0 is in use or the node has swap already: refusing" >&2; exit 1
fi
trap 'swapoff /dev/zram0 2>/dev/null; echo 1 > /sys/block/zram0/reset' EXIT
echo lz4 > /sys/block/zram0/comp_algorithm; echo 1G > /sys/block/zram0/disksize; mkswap /dev/zram0 >/dev/null; swapon /dev/zram0
for m in force_empty limit; do
  M=/sys/fs/cgroup/memory/hibcmp-$m F=/sys/fs/cgroup/freezer/hibcmp-$m
  mkdir -p $M $F; echo 1 > $M/memory.use_hierarchy 2>/dev/null
  echo $((2048<<20)) > $M/memory.limit_in_bytes; echo $((2048<<20)) > $M/memory.memsw.limit_in_bytes
  sh -c "echo \$\$ > $M/cgroup.procs; echo \$\$ > $F/cgroup.procs; exec python3 -c \"
import os,time
d=[{'id':i,'name':os.urandom(24).hex(),'s':i*0.5} for i in range(300000)]
open('/tmp/hibcmp-ready','w').write('1'); time.sleep(600)\"" &
  P=$!
  while [ ! -s /tmp/hibcmp-ready ]; do sleep 0.1; done; rm -f /tmp/hibcmp-ready
  echo FROZEN > $F/freezer.state; sleep 0.2
  before=$(cat $M/memory.usage_in_bytes)
  t0=$(date +%s%N)
  if [ $m = force_empty ]; then echo 0 > $M/memory.force_empty; rc=$?
  else echo $((4<<20)) > $M/memory.limit_in_bytes; rc=$?; echo $((2048<<20)) > $M/memory.limit_in_bytes; fi
  t1=$(date +%s%N)
  after=$(cat $M/memory.usage_in_bytes)
  echo "$m: rc=$rc ${before}->${after} bytes ($(( (t1-t0)/1000000 )) ms), limit after $(cat $M/memory.limit_in_bytes), memsw $(cat $M/memory.memsw.limit_in_bytes)"
  echo THAWED > $F/freezer.state; kill -9 $P; wait $P 2>/dev/null; sleep 0.2; rmdir $M $F
done
