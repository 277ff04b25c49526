# frozen_string_literal: true

# Strobe beside stackprof and vernier, measured in the same run on a modern
# Ruby (vernier needs 3.2.1+; its gem must be installed):
#
#   1. instructions per sample under callgrind: the same workload in :wall
#      at 1 ms, unprofiled and under each profiler, in child processes;
#      (Ir(profiled) - Ir(unprofiled)) / samples recorded, whole process
#      (timer threads, handlers, recording), immune to machine noise;
#   2. wall-mode slowdown at 1 kHz and 10 kHz, alternating unprofiled and
#      profiled segments of the workload, with the share of the requested
#      samples each profiler delivered;
#   3. bytes per sample: in memory (growth of the process's resident memory
#      over a profile, per sample; Strobe's own count too) and on disk (each
#      profiler's own file, gzipped);
#   4. samples per thread with 5 threads alive (one computing, four asleep)
#      in :wall at 1 kHz for 1 s: what each profiler sees of each thread.
#
#   ruby -Ilib bench/peers.rb          # all four (about 4 min)
#   ruby -Ilib bench/peers.rb cost slowdown bytes threads   # some
#
# Settings: BENCH_CALLGRIND_SECONDS (8: unprofiled run under valgrind),
# BENCH_ROUNDS (9), BENCH_SEGMENT (0.3 s), BENCH_BYTES_SECONDS (10),
# BENCH_DEPTH (30).

require_relative "bench_helper"
require "tmpdir"
require "zlib"
begin
  require "vernier"
rescue LoadError
  abort "bench/peers.rb needs the vernier gem (gem install vernier; Ruby 3.2.1+)"
end

module Peers
  KINDS = %i[strobe stackprof vernier].freeze
  LABELS = { strobe: "Strobe", stackprof: "stackprof", vernier: "vernier" }.freeze
  CALLGRIND_SECONDS = Bench.env_float("BENCH_CALLGRIND_SECONDS", 8)
  ROUNDS = Bench.env_int("BENCH_ROUNDS", 9)
  SEGMENT = Bench.env_float("BENCH_SEGMENT", 0.3)
  BYTES_SECONDS = Bench.env_float("BENCH_BYTES_SECONDS", 10)
  DEPTH = Bench.env_int("BENCH_DEPTH", 30)
  MIN_CALLGRIND_SAMPLES = 100

  module_function

  # ---- one interface to the three profilers ---------------------------------

  def start(kind, interval, raw: false)
    started =
      case kind
      when :strobe then Strobe.start(mode: :wall, interval: interval, raw: raw)
      when :stackprof then StackProf.start(mode: :wall, interval: interval, raw: raw)
      when :vernier then Vernier.start_profile(mode: :wall, interval: interval)
      end
    started or raise "#{kind} did not start"
  end

  # Stops kind; {samples:, threads: {name => samples}, result:}. A sample
  # is one stack recorded at one tick (vernier's weights count the ticks
  # it folded into one entry for a thread that did not run).
  def stop(kind)
    case kind
    when :strobe
      Strobe.stop
      result = Strobe.results
      { samples: result[:samples], result: result,
        threads: result[:threads].values.to_h { |t| [t[:name].to_s, t[:samples]] } }
    when :stackprof
      StackProf.stop
      result = StackProf.results
      { samples: result[:samples], result: result, threads: nil }
    when :vernier
      result = Vernier.stop_profile
      { samples: result.total_weights, result: result,
        threads: result.threads.values.to_h { |t| [t[:name].to_s, t[:weights].sum] } }
    end
  end

  def workload
    @workload ||= Bench::Workload.new(depth: DEPTH)
  end

  # ---- 1. instructions per sample -------------------------------------------

  # Child: the workload (units) under kind ("none" for unprofiled); prints
  # the samples recorded.
  def child(kind, units)
    kind = kind.to_sym
    start(kind, 1000) unless kind == :none
    workload.run(Integer(units))
    puts kind == :none ? 0 : stop(kind)[:samples]
    $stdout.flush
    exit!(0)
  end

  # [instructions, samples] of the workload under kind, under callgrind.
  def callgrind_run(dir, kind, units)
    out, printed = Bench.callgrind(__FILE__, dir, kind, kind, units)
    [Bench.callgrind_total(out), Integer(printed.split.last)]
  end

  def cost
    abort "valgrind is not installed" unless system("valgrind --version", out: File::NULL, err: File::NULL)

    # Under valgrind the workload runs some 50 times slower.
    units = workload.calibrate(CALLGRIND_SECONDS / 50.0)
    Bench.header("1. Instructions per sample under callgrind (:wall at 1 ms, #{DEPTH} frames deep, whole process)")
    runs = Dir.mktmpdir("strobe-peers") do |dir|
      Bench.in_parallel([:none, *KINDS], 2) { |kind| callgrind_run(dir, kind, units) }
    end
    base, = runs[:none]
    # Too few samples under valgrind (which runs one thread at a time) and
    # the figure is the profiler's fixed cost, not a sample's: not shown.
    per_sample = KINDS.to_h do |kind|
      [kind, runs[kind][1] >= MIN_CALLGRIND_SAMPLES ? (runs[kind][0] - base).fdiv(runs[kind][1]) : nil]
    end
    Bench.table(["profiler", "samples", "Ir/sample", "Strobe / it"],
                KINDS.map do |kind|
                  [LABELS[kind], runs[kind][1], per_sample[kind]&.round || "-",
                   per_sample[kind] ? Bench.ratio(per_sample[:strobe], per_sample[kind]) : "-"]
                end)
    puts "Ir/sample = (Ir of the profiled run - Ir of the unprofiled run) / samples recorded; " \
         "not shown below #{MIN_CALLGRIND_SAMPLES} samples (the sampler could not run under valgrind)."
  end

  # ---- 2. slowdown and samples delivered ------------------------------------

  def segment(kind, units, interval)
    GC.start
    start(kind, interval) if kind
    t0 = Bench.now
    own0 = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
    workload.run(units)
    own = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - own0
    wall = Bench.now - t0
    samples = kind ? stop(kind)[:samples] : 0
    { kind: kind, time: own, wall: wall, samples: samples }
  end

  def slowdown
    units = workload.calibrate(SEGMENT)
    Bench.header("2. Slowdown of a CPU-bound program in :wall (its thread's CPU time; median of #{ROUNDS} rounds)")
    [1000, 100].each do |interval|
      timeline = []
      (ROUNDS + 1).times do |round|
        segments = KINDS.rotate(round).flat_map { |kind| [segment(nil, units, interval), segment(kind, units, interval)] }
        timeline.concat(segments) unless round.zero?
        $stderr.print "."
      end
      $stderr.puts
      rows = KINDS.map do |kind|
        profiled = timeline.each_index.select { |i| timeline[i][:kind] == kind }
        adjacent = profiled.flat_map { |i| [timeline[i - 1], timeline[i + 1]].compact.reject { |s| s[:kind] } }
        slow = Bench.median(profiled.map { |i| timeline[i][:time] }) / Bench.median(adjacent.map { |s| s[:time] }) - 1
        delivered = profiled.sum { |i| timeline[i][:samples] } / profiled.sum { |i| timeline[i][:wall] * 1e6 / interval }
        [kind, slow, delivered]
      end
      puts
      puts "interval #{interval} µs (#{1_000_000 / interval} Hz)"
      strobe = rows.assoc(:strobe)[1]
      Bench.table(["profiler", "slowdown", "samples delivered", "Strobe's slowdown / its"],
                  rows.map do |kind, slow, delivered|
                    [LABELS[kind], format("%+.2f %%", slow * 100), format("%.1f %%", delivered * 100), Bench.ratio(strobe, slow)]
                  end)
    end
  end

  # ---- 3. bytes per sample --------------------------------------------------

  def rss
    File.read("/proc/self/status")[/^VmRSS:\s+(\d+) kB/, 1].to_i * 1024
  end

  def file_bytes(kind, result, dir)
    path = File.join(dir, "#{kind}.gz")
    case kind
    when :strobe then Strobe.save(result, File.join(dir, "strobe.json.gz")) && File.size(File.join(dir, "strobe.json.gz"))
    when :stackprof then Zlib.gzip(Marshal.dump(result)).bytesize # its own out: format, gzipped
    when :vernier then File.binwrite(path, result.to_firefox(gzip: true)) && File.size(path)
    end
  end

  def bytes
    units = workload.calibrate(0.02)
    Bench.header("3. Bytes per sample: #{BYTES_SECONDS} s of :wall at 100 µs, raw samples kept, each profiler its own run")
    rows = Dir.mktmpdir("strobe-peers-bytes") do |dir|
      KINDS.map do |kind|
        3.times { GC.start }
        before = rss
        start(kind, 100, raw: true)
        deadline = Bench.now + BYTES_SECONDS
        workload.run(units) while Bench.now < deadline
        own = kind == :strobe ? Strobe::Native.memsize : nil
        run = stop(kind)
        grown = rss - before
        $stderr.print "."
        [kind, run[:samples], grown.fdiv(run[:samples]), own&.fdiv(run[:samples]),
         file_bytes(kind, run[:result], dir).fdiv(run[:samples])]
      end
    end
    $stderr.puts
    Bench.table(["profiler", "samples", "resident memory growth/sample", "own count/sample", "file gzipped/sample"],
                rows.map do |kind, samples, grown, own, file|
                  [LABELS[kind], samples, format("%.1f", grown), own ? format("%.1f", own) : "-", format("%.2f", file)]
                end)
    puts "Resident memory growth includes the result built at stop (stackprof's and vernier's are Ruby objects)."
    puts "Files: Strobe's .json.gz, stackprof's Marshal dump gzipped, vernier's Firefox JSON gzipped."
  end

  # ---- 4. samples per thread ------------------------------------------------

  5.times do |i|
    module_eval <<~RUBY, __FILE__, __LINE__ + 1
      def self.worker_#{i}(deadline)
        if #{i}.zero?
          x = 0
          x += 1 while Bench.now < deadline
        else
          sleep(deadline - Bench.now)
        end
      end
    RUBY
  end

  def threads
    Bench.header("4. Samples per thread, 5 threads alive (worker_0 computing, 1-4 asleep), :wall at 1 kHz for 1 s")
    rows = KINDS.map do |kind|
      start(kind, 1000)
      deadline = Bench.now + 1.0
      Array.new(5) { |i| Thread.new { Thread.current.name = "worker_#{i}"; send(:"worker_#{i}", deadline) } }.each(&:join)
      run = stop(kind)
      counts = Array.new(5) do |i|
        next run[:threads].fetch("worker_#{i}", 0) if run[:threads]

        frame = run[:result][:frames].values.find { |f| f[:name] == "Peers.worker_#{i}" }
        frame ? frame[:total_samples] : 0
      end
      [kind, counts]
    end
    Bench.table(["profiler", *Array.new(5) { |i| "worker_#{i}" }, "all"],
                rows.map { |kind, counts| [LABELS[kind], *counts, counts.sum] })
    puts "Each thread lives 1 s: 1000 samples per thread is every tick."
  end

  def main(parts)
    parts = %w[cost slowdown bytes threads] if parts.empty?
    puts "Ruby #{RUBY_VERSION}, Strobe #{Strobe::VERSION}, stackprof #{StackProf::VERSION}, vernier #{Vernier::VERSION}"
    parts.each { |part| public_send(part) }
  end
end

if $PROGRAM_NAME == __FILE__
  if ARGV.first == "--child"
    Peers.child(*ARGV.drop(1))
  else
    Peers.main(ARGV)
  end
end
