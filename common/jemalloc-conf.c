/* SPDX-License-Identifier: Apache-2.0 */
/* jemalloc's configuration, linked into psnet's daemons only (not into
 * libpsnet, whose users choose their own allocator). libzmq mallocs one buffer
 * per large received message: with jemalloc's default decay a 16 MiB message
 * costs thousands of fresh page faults. Keep dirty pages and use transparent
 * huge pages (measured: 0.3 GB/s -> 3-7 GB/s). */
#if HAVE_JEMALLOC
const char *malloc_conf = "dirty_decay_ms:-1,muzzy_decay_ms:-1,thp:always,background_thread:false";
#endif
