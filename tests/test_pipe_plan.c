/* test_pipe_plan.c — the pipelined kernels' step plan (lib/kernels/kernels.h): the arithmetic the
 * host (to advance pipe_base) and the device (to cut a block's share) both run, so it is checked
 * here without a GPU.  What the kernels rely on: every sub-slot of every block lies inside the
 * staging area's four slots, the steps cover the block's share, and both ranks get the same plan
 * from the same size; what the measurements chose: four steps per share, none below 64 KiB. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/kernels.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

START_TEST(test_room_fits_the_staging_area) {
  const size_t slots[] = {16 * KiB, 512 * KiB, MiB, 8 * MiB, 8 * MiB + 16, 32 * MiB};
  const unsigned blocks[] = {1, 2, 3, 64, 100, 128}, subslots[] = {2, 4};
  for (size_t s = 0; s < sizeof slots / sizeof *slots; s++)
    for (size_t b = 0; b < sizeof blocks / sizeof *blocks; b++)
      for (size_t j = 0; j < 2; j++) {
        const size_t room = fc_pipe_room_bytes(slots[s], blocks[b], subslots[j]);
        ck_assert_uint_eq(room % 16, 0);
        /* sub-slot (k, block) starts at (k * blocks + block) * step: the last one ends inside */
        ck_assert_uint_le(room * blocks[b] * subslots[j], 4 * slots[s]);
        ck_assert_uint_gt((room + 16) * blocks[b] * subslots[j], 4 * slots[s]); /* no room wasted */
      }
  ck_assert_uint_eq(fc_pipe_room_bytes(8 * MiB, 0, 2), 0);
  ck_assert_uint_eq(fc_pipe_room_bytes(8 * MiB, 128, 0), 0);
}
END_TEST

START_TEST(test_steps_cover_each_share) {
  const size_t slots[] = {512 * KiB, MiB, 8 * MiB, 32 * MiB};
  const unsigned blocks[] = {1, 2, 7, 64, 128}, subslots[] = {2, 4};
  const size_t sizes[] = {1,       15,           16,       17,       4095,          4096,       65536, MiB - 1,
                          8 * MiB, 8 * MiB + 4, 16 * MiB, 33554431, 100000007 * 2, 256 * MiB, 512 * MiB};
  for (size_t s = 0; s < sizeof slots / sizeof *slots; s++)
    for (size_t b = 0; b < sizeof blocks / sizeof *blocks; b++)
      for (size_t j = 0; j < 2; j++)
        for (size_t z = 0; z < sizeof sizes / sizeof *sizes; z++) {
          const size_t bytes = sizes[z], room = fc_pipe_room_bytes(slots[s], blocks[b], subslots[j]);
          const size_t step = fc_pipe_step_bytes(bytes, slots[s], blocks[b], subslots[j]);
          const size_t steps = fc_pipe_steps(bytes, slots[s], blocks[b], subslots[j]);
          const size_t share = fc_pipe_block_share(bytes, blocks[b]);
          /* the blocks' shares (16-byte granules, as fc_block_range) cover the message */
          ck_assert_uint_eq(share % 16, 0);
          ck_assert_uint_ge(share * blocks[b], bytes);
          ck_assert_uint_lt((share - 16) * blocks[b], bytes);
          if (room < FC_PIPE_MIN_STEP_BYTES) {
            ck_assert_uint_eq(step, 0);
            ck_assert_uint_eq(steps, 0);
            continue;
          }
          ck_assert_uint_eq(step % 16, 0);
          ck_assert_uint_le(step, room);
          ck_assert_uint_ge(step, room < FC_PIPE_STEP_FLOOR_BYTES ? room : FC_PIPE_STEP_FLOOR_BYTES);
          ck_assert_uint_ge(steps * step, share); /* covered */
          ck_assert_uint_lt((steps - 1) * step, share); /* no step left empty in every block */
          if (share / FC_PIPE_MIN_STEPS >= FC_PIPE_STEP_FLOOR_BYTES && share / FC_PIPE_MIN_STEPS + 16 <= room)
            ck_assert_uint_eq(steps, FC_PIPE_MIN_STEPS);
        }
}
END_TEST

/* The plans docs/PERFORMANCE.md measured (8 MiB slots, 128 blocks, 2 sub-slots). */
START_TEST(test_default_plans) {
  ck_assert_uint_eq(fc_pipe_room_bytes(8 * MiB, 128, 2), 128 * KiB);
  /* allreduce 16 MB: a 128 KiB share in 2 steps of the 64 KiB floor */
  ck_assert_uint_eq(fc_pipe_step_bytes(16 * MiB, 8 * MiB, 128, 2), 64 * KiB);
  ck_assert_uint_eq(fc_pipe_steps(16 * MiB, 8 * MiB, 128, 2), 2);
  /* 32 MB: 4 of 64 KiB; 64 MB: 4 of 128 KiB; 256 MB: 16 of 128 KiB (the room) */
  ck_assert_uint_eq(fc_pipe_steps(32 * MiB, 8 * MiB, 128, 2), 4);
  ck_assert_uint_eq(fc_pipe_step_bytes(64 * MiB, 8 * MiB, 128, 2), 128 * KiB);
  ck_assert_uint_eq(fc_pipe_steps(64 * MiB, 8 * MiB, 128, 2), 4);
  ck_assert_uint_eq(fc_pipe_step_bytes(256 * MiB, 8 * MiB, 128, 2), 128 * KiB);
  ck_assert_uint_eq(fc_pipe_steps(256 * MiB, 8 * MiB, 128, 2), 16);
  /* allgather of 8 MiB per rank: one 64 KiB step per block */
  ck_assert_uint_eq(fc_pipe_steps(8 * MiB + 4, 8 * MiB, 128, 2), 2); /* one element over: 2 */
  ck_assert_uint_eq(fc_pipe_steps(8 * MiB, 8 * MiB, 128, 2), 1);
  /* 4 sub-slots halve the room */
  ck_assert_uint_eq(fc_pipe_step_bytes(256 * MiB, 8 * MiB, 128, 4), 64 * KiB);
  /* a room below FC_PIPE_MIN_STEP_BYTES: the kernels are not used (gpu.c) */
  ck_assert_uint_lt(fc_pipe_room_bytes((size_t)FC_MAX_BLOCKS * FC_PIPE_MIN_STEP_BYTES - 16, FC_MAX_BLOCKS, 4),
                    FC_PIPE_MIN_STEP_BYTES);
  ck_assert_uint_eq(fc_pipe_steps(MiB, (size_t)FC_MAX_BLOCKS * FC_PIPE_MIN_STEP_BYTES - 16, FC_MAX_BLOCKS, 4), 0);
  /* nothing to move: no steps */
  ck_assert_uint_eq(fc_pipe_steps(0, 8 * MiB, 128, 2), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("pipe_plan");
  TCase *tc = tcase_create("plan");
  tcase_add_test(tc, test_room_fits_the_staging_area);
  tcase_add_test(tc, test_steps_cover_each_share);
  tcase_add_test(tc, test_default_plans);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_ENV);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
