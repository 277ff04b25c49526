# frozen_string_literal: true

# Bytes per raw sample, Strobe vs stackprof: a 10 kHz wall-mode raw run of
# a CPU-bound program with varied stacks (Bench::Workload), once under each
# profiler, then the profile's size in memory and as files.
#
#   ruby -Ilib bench/bytes_per_sample.rb
#   BENCH_SECONDS=10 ruby -Ilib bench/bytes_per_sample.rb
#
# Settings: BENCH_SECONDS (60 per profiler), BENCH_INTERVAL (100 µs),
# BENCH_DEPTH (30).

require_relative "bench_helper"
require "json"
require "zlib"
require "tmpdir"

module BytesPerSample
  SECONDS = Bench.env_float("BENCH_SECONDS", 60)
  INTERVAL = Bench.env_int("BENCH_INTERVAL", 100)
  DEPTH = Bench.env_int("BENCH_DEPTH", 30)
  BUDGETS = { memory: 16, json: 19, gzip: 5 }.freeze

  module_function

  # Runs the workload for SECONDS under the profiler; returns what the block
  # (called after stop) returns, and the profiled time.
  def profile(start, stop)
    workload = Bench::Workload.new(depth: DEPTH)
    units = workload.calibrate(0.02)
    GC.start
    start.call or raise "profiler did not start"
    deadline = Bench.now + SECONDS
    elapsed = Bench.time { workload.run(units) while Bench.now < deadline }
    stop.call
    [yield, elapsed]
  end

  # Raw stacks in a result (entries of `raw`, each a run of identical samples).
  def raw_stacks(raw)
    count = 0
    i = 0
    while i < raw.size
      count += 1
      i += raw[i] + 2
    end
    count
  end

  # What an empty profile holds (fixed tables and buffers), in bytes.
  def strobe_fixed_memory
    Strobe.start(mode: :custom) or raise "Strobe did not start"
    Strobe.stop
    Strobe::Native.memsize.tap { Strobe.results }
  end

  def strobe(dir)
    (memsize, result), elapsed = profile(-> { Strobe.start(mode: :wall, interval: INTERVAL, raw: true) }, -> { Strobe.stop }) do
      [Strobe::Native.memsize, Strobe.results]
    end
    json = File.join(dir, "strobe.json")
    gzip = File.join(dir, "strobe.json.gz")
    Strobe.save(result, json)
    Strobe.save(result, gzip)
    stats(result, elapsed).merge(memory: memsize, fixed: strobe_fixed_memory, json: File.size(json), gzip: File.size(gzip),
                                 round_trip: round_trip?(result, json) && round_trip?(result, gzip))
  end

  # The file holds every sample: loading it gives back the same raw data.
  def round_trip?(result, path)
    loaded = Strobe.load(path)
    %i[raw raw_lines raw_sample_timestamps samples].all? { |key| loaded[key] == result[key] }
  end

  def stackprof
    result, elapsed = profile(-> { StackProf.start(mode: :wall, interval: INTERVAL, raw: true) }, -> { StackProf.stop }) do
      StackProf.results
    end
    json = JSON.generate(result)
    stats(result, elapsed).merge(
      # stackprof's raw buffer: one 8-byte VALUE per raw-array entry, and a
      # 16-byte {timestamp, delta} per sample.
      memory: result[:raw].size * 8 + result[:raw_sample_timestamps].size * 16,
      json: json.bytesize,
      gzip: Zlib.gzip(json).bytesize,
      marshal: Marshal.dump(result).bytesize
    )
  end

  def stats(result, elapsed)
    { raw_samples: result[:raw_sample_timestamps].size, samples: result[:samples],
      missed: result[:missed_samples].to_i, stacks: raw_stacks(result[:raw]),
      frames: result[:frames].size, rate: result[:samples] / elapsed }
  end

  def per_sample(stat, key)
    stat[key] && stat[key].fdiv(stat[:raw_samples])
  end

  def fmt(value)
    value ? format("%.2f", value) : "-"
  end

  def main
    Bench.header("Bytes per raw sample: #{SECONDS} s of wall mode at #{INTERVAL} µs, raw: true, each profiler its own run")
    ours = Dir.mktmpdir("strobe-bytes") { |dir| strobe(dir) }
    $stderr.puts "Strobe run done"
    GC.start
    theirs = stackprof
    GC.start

    Bench.table(
      ["run", "raw samples", "samples/s", "missed", "raw stacks", "frames"],
      [["Strobe", ours], ["stackprof", theirs]].map do |name, s|
        [name, s[:raw_samples], s[:rate].round, s[:missed], s[:stacks], s[:frames]]
      end
    )
    puts
    rows = [
      ["in memory", :memory, :memory], ["JSON file", :json, :json], ["gzipped JSON file", :gzip, :gzip]
    ].map do |label, key, budget|
      o = per_sample(ours, key)
      t = per_sample(theirs, key)
      b = BUDGETS[budget]
      [label, fmt(o), fmt(t), Bench.ratio(o, t), "< #{b}", o < b ? "within" : "OVER"]
    end
    rows << ["Marshal (stackprof's out: format)", "-", fmt(per_sample(theirs, :marshal)), "", "", ""]
    Bench.table(["bytes per raw sample", "Strobe", "stackprof", "ratio", "Strobe budget", "verdict"], rows)
    puts
    puts "Strobe in memory: Strobe::Native.memsize after stop, before results (tables, counts, sample log);"
    puts "  #{ours[:fixed]} bytes of it are there for an empty profile (#{fmt(ours[:fixed].fdiv(ours[:raw_samples]))} per sample in this run)."
    puts "Strobe files: Strobe.save to .json and .json.gz (its compact node-table format);"
    puts "  Strobe.load of each gives back the same raw samples: #{ours[:round_trip] ? 'yes' : 'NO'}."
    puts "stackprof in memory: computed from its result as raw.size * 8 + raw_sample_timestamps.size * 16"
    puts "  (its raw buffer holds one 8-byte VALUE per raw-array entry and 16 bytes of timestamps per sample)."
    puts "stackprof files: JSON.generate of its result, and that gzipped with Zlib.gzip."
    puts "ratio = Strobe / stackprof. raw stacks = entries in :raw (runs of identical consecutive samples)."
  end
end

BytesPerSample.main if $PROGRAM_NAME == __FILE__
