# frozen_string_literal: true

# A large, realistic stackprof-shaped raw profile for report benchmarks,
# built without running a profiler for minutes: a random call graph of
# BENCH_FRAMES methods in BENCH_FILES files, BENCH_STACKS distinct stacks
# 10 to 60 deep walked through it, and BENCH_SAMPLES samples that move
# between related stacks the way a program does (runs of the same stack,
# mostly small changes near the leaf). Deterministic for a given seed.
# Aggregates (samples, total_samples, edges, lines, threads) are derived
# from the raw arrays by Strobe's own C code (Native.thread_subset), so
# they are consistent with them.
#
#   require_relative "report_data"
#   result = ReportData.build(samples: 1_000_000)
module ReportData
  module_function

  # lines: :random gives every frame of every raw entry a line of its own
  # (within 20 of the method's first line), so nearly every (frame, line)
  # stack node is new: the worst case for anything that keeps lines.
  # :call_sites is what a program does: a caller's line is the line of its
  # call to the next frame (fixed per caller and callee), and only the
  # leaf's line varies.
  def build(samples: 1_000_000, frames: 5_000, files: 400, stacks: 20_000, seed: 1, lines: :random)
    rng = Random.new(seed)
    frame_ids = Array.new(frames) { |i| 10_000 + i * 8 }
    files_list = Array.new(files) { |i| "/app/lib/component_#{i % 40}/file_#{i}.rb" }
    frame_table = frame_ids.each_with_index.to_h do |id, i|
      [id, { name: "Component#{i % 97}::Class#{i % 331}#method_#{i}", file: files_list[i % files],
             line: 1 + rng.rand(400) }]
    end
    callees = Array.new(frames) { Array.new(1 + rng.rand(6)) { rng.rand(frames) } }

    roots = Array.new(8) { rng.rand(frames) }
    stack_list = Array.new(stacks) do
      depth = 10 + rng.rand(51)
      f = roots[rng.rand(roots.size)]
      Array.new(depth) do
        cur = f
        f = callees[f][rng.rand(callees[f].size)]
        cur
      end
    end

    raw = []
    raw_lines = []
    timestamps = []
    t = 1_000_000
    remaining = samples
    current = stack_list[0]
    while remaining.positive?
      # Mostly a change near the leaf, sometimes a jump to another stack.
      if rng.rand < 0.1
        current = stack_list[rng.rand(stack_list.size)]
      else
        keep = [current.size - 1 - rng.rand(4), 1].max
        tail = stack_list[rng.rand(stack_list.size)]
        current = current.first(keep) + tail.last(rng.rand(4) + 1)
      end
      run = [1 + rng.rand(20), remaining].min
      raw << current.size
      raw_lines << current.size
      current.each_with_index do |f, level|
        raw << frame_ids[f]
        first = frame_table[frame_ids[f]][:line]
        callee = current[level + 1]
        raw_lines << (lines == :random || callee.nil? ? first + rng.rand(20) : first + (f * 31 + callee) % 20)
      end
      raw << run
      raw_lines << run
      run.times { timestamps << (t += 1000) }
      remaining -= run
    end

    result = {
      version: 1.2, mode: :wall, interval: 1000, samples: samples, gc_samples: 0, missed_samples: 0,
      metadata: {}, frames: frame_table, raw: raw, raw_lines: raw_lines,
      raw_sample_timestamps: timestamps,
      raw_timestamp_deltas: [1000] + Array.new(samples - 1, 1000),
      raw_sample_threads: Array.new(samples, 1), threads: { 1 => { name: "main", samples: samples } }
    }
    whole = Strobe::Native.thread_subset(result, 1)
    whole.delete(:thread)
    whole
  end
end
