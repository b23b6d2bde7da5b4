"""Every constant behind the requant launch, with its unit and the reason for its value.

The requant is memory-bound: it reads one fp8 byte and writes one fp8 byte per element, plus one
fp32 scale per 128 elements. What matters is how many bytes each lane moves per memory instruction,
how many programs are resident to keep bytes in flight, and how few programs exit without work."""

# --- the data -------------------------------------------------------------------------------------

# elements: DeepEP quantizes activations with one fp32 scale per 128 columns.
GROUP_SIZE = 128
# bytes per element of the fp8 payload, in and out.
FP8_BYTES = 1

# --- the tuned tile: [g_block, GROUP_SIZE] whole scale groups ------------------------------------

# warps per program: 4 warps (128 lanes on a warp-32 GPU) keep a 2 KiB tile at 16 B per lane, and
# let 16 programs share one Hopper SM (2048 threads), so decode's many tiny programs overlap.
TUNED_WARPS = 4
# bytes per lane per tile with many experts: 16 B is one 128-bit load per lane, the widest vector
# load NVIDIA and AMD GPUs issue, so a tile is one memory instruction per lane.
BYTES_PER_LANE_WIDE = 16
# bytes per lane with few experts: halving the tile doubles the column blocks, which a grid of
# few experts needs to put a program on every SM.
BYTES_PER_LANE_NARROW = 8
# experts: from this many local experts up the expert axis alone fills the GPU's SMs with
# programs (32 experts x 4 m-programs x 4 column blocks > 132 SMs x 2), so tiles can be wide.
WIDE_TILE_MIN_EXPERTS = 32

# --- the m-grid: programs per expert along the row axis ------------------------------------------
# (Figures below: H200, 7168 columns, `benchmarks/requant_peer.py --candidates`, 2026-12-02, on the
# kernel before its cache hints and row pairs.)

# programs per expert, lower bound (unless the program budget below is smaller): one program per
# expert would serialize an expert's rows when the dispatch is a little uneven (16 experts, one
# row each but one expert at 16: 3.28 us at m-grid 2, 2.84 us at 4).
M_GRID_MIN = 4
# programs per expert, upper bound: the legacy launch's fixed grid, so no batch launches more
# programs along the row axis than the legacy launch does.
M_GRID_MAX = 32
# expert x row programs per column block while rows are scarce: about 8 resident 4-warp programs
# on each of an H200's 132 SMs. More programs than this are mostly early exits once there are
# fewer rows than programs. At 512 experts it is 2 per expert, below M_GRID_MIN: 512 experts x 2
# rows with one expert at 16x, 7.37 us at m-grid 2 against 8.70 us at 4.
SCARCE_PROGRAM_BUDGET = 1024
# rows per expert (as a power of two): below this the full m-grid would give its programs fewer
# than two rows each, so rows are "scarce" and the program budget above applies. At and above it
# every program carries rows and the m-grid returns to the legacy 32.
SCARCE_ROWS_BELOW = 2 * M_GRID_MAX
# rows per program the scarce budget may leave at most: with more, the budget yields to one
# program per this many rows (512 experts x 32 rows: 62.20 us at m-grid 8, 62.81 us at 4,
# 64.75 us at 2; 256 experts x 32 rows: 32.86 us at 8, 33.41 us at 4).
SCARCE_ROWS_PER_PROGRAM = 4

# programs resident at once: 16 4-warp programs on each of an H200's 132 SMs is 2112, rounded down
# to a power of two. A grid of at most this many programs (all column blocks) runs in one wave.
ONE_WAVE_PROGRAMS = 2048
# programs per expected row while the grid still fits ONE_WAVE_PROGRAMS: resident programs cost
# nothing while they wait, so a hot expert's rows spread over them (up to M_GRID_MAX, and only as
# far as the grid stays one wave). With one expert at 16x: 8 experts x 2 rows, 2.32 us at m-grid
# 16 against 2.67 us at 8 (legacy 2.39 us); x 4 rows, 2.46 us at 32 against 2.86 us at 16;
# 16 experts x 4 rows, 3.10 us at 16 against 3.94 us at 4 (legacy 3.32 us). Uniform rows lose
# nothing to the waiting programs: 8 experts x 8 rows, 2.61 us at 8 and 2.62 us at 32.
RESIDENT_PROGRAMS_PER_ROW = 8
# programs per expert, lower bound in a resident grid: the m-grid for 1 and 2 expected rows alike,
# so the dispatcher's one-high report of an average of 1 row does not move it.
RESIDENT_M_GRID_MIN = 16

# --- how a program moves its rows ------------------------------------------------------------------

# bytes (the live FP8 payload one way, experts x estimated rows x hidden) up to which loads are
# evict-first and stores cache-streaming. The H200 run behind docs/backends/requant.md timed the
# rule's launch both ways at every point: with the hints a median 8% faster under 10 us (8 experts x
# 8 rows x 7168: 2.34 against 2.56 us; 512 experts x 2 rows: 6.20 against 6.72 us), still ahead
# at 112 MiB (128 experts x 128 rows: 61.39 against 61.71 us), behind from 224 MiB (256 x 128
# rows: 120.78 against 120.20 us; 512 x 512 rows: 967.15 against 939.74 us).
STREAMING_MAX_BYTES = 128 << 20
# expected rows per program from which a program takes its rows two at a time (both rows' loads
# in flight before either is used): a program that will loop pays one memory round trip per two
# rows instead of per row (8 experts, every other one empty and 1024 rows on each live one:
# 20.22 against 24.57 us; 16 experts x 128 rows: 10.08 against 11.04 us).
PAIRED_ROWS_PER_PROGRAM = 2
# experts up to which rows are paired at any payload. Above, a pair's registers cost more than
# the second load in flight gains while the payload is latency-bound (every other expert empty:
# 256 experts x 64 rows on each live one, 36.99 against 34.51 us; 64 experts x 256 rows, 35.95
# against 34.81 us), and without an estimate a hot expert's long row loop in a grid of 16K-64K
# programs is 15-35% slower paired (512 experts x 32 rows, one expert at 16x: 95.95 against
# 68.74 us): above it only a bandwidth-bound payload (not streaming) with an estimate pairs
# (512 experts x 512 rows: 939.74 against 948.94 us). Figures of both constants: the measured run
# of docs/backends/requant.md, the rule's launch with and without pairing.
PAIRED_MAX_EXPERTS = 32

# --- the row cap and the shared overflow phase ---------------------------------------------------

# row_cap = ROW_CAP_SLACK x expected rows: rows beyond twice the average belong to a hot expert
# and are shared by every program; ordinary variation around the average stays with its expert,
# so the shared phase's per-row lookup is only paid under real imbalance. The cap is never below
# the m-grid either: an expert with no more rows than programs gives each program at most one, and
# moving those rows to the shared phase would only add its bookkeeping.
ROW_CAP_SLACK = 2
# experts: the shared phase keeps a prefix sum over every expert's overflow in one program's
# registers (EXPERTS_POW2 int32 values over 128 lanes); above this many local experts it would
# cost more registers than it saves, so the cap is lifted and every row stays with its expert.
OVERFLOW_MAX_EXPERTS = 4096

# --- the legacy launch (the benchmark baseline) --------------------------------------------------

# elements per tile: 1024 flat elements, i.e. 4 B per lane on 8 warps, which Triton does not
# vectorize into 128-bit accesses; the scale was gathered once per element.
LEGACY_TILE_ELEMENTS = 1024
# warps per program in the legacy launch.
LEGACY_WARPS = 8
# programs per expert along rows in the legacy launch, whatever the batch.
LEGACY_M_GRID = 32

# --- running without a GPU -----------------------------------------------------------------------

# lanes per warp assumed under TRITON_INTERPRET=1, where a program is a numpy array and has no
# lanes: 32 gives the tiles an NVIDIA GPU gets, so interpreter tests run the H200's geometry.
INTERPRETER_WARP_SIZE = 32

# --- support -------------------------------------------------------------------------------------

# NVIDIA compute capability: Triton converts fp32 to e4m3fn (cvt.rn.satfinite.e4m3x2) from sm_89.
MIN_NVIDIA_FP8_CAPABILITY = (8, 9)
