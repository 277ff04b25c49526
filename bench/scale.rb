# frozen_string_literal: true

# Profiles of any size (issue 22): the time and peak memory of `strobe
# report` on generated profile files, each command in a process of its own
# (/usr/bin/time's maximum resident set), beside stackprof's Report on the
# same data where it can run at all.
#
#   one profile   BENCH_SAMPLES samples (10,000,000) of BENCH_THREADS
#                 threads (8), stacks BENCH_DEPTH frames deep (20) drawn
#                 from BENCH_STACKS distinct stacks (200,000), a new one
#                 for most samples: --text, --flamegraph, --pprof
#   a merge       BENCH_FILES files (100) of BENCH_FILE_SAMPLES samples
#                 (100,000) each, reported as one (--text)
#
# The profile's compact size is what Strobe keeps per sample in memory
# (up to 15 bytes: node, time, thread and state) plus its node table (12 bytes a
# node): the figure a report's memory is held against (for the merge,
# that of the merged profile: Strobe::Stacks#bytesize).
# stackprof's Report gets the result Strobe.load builds (stackprof's raw
# arrays) in a process limited to BENCH_PEER_GB of address space (8), and
# is given up past BENCH_PEER_SECONDS (600).
#
#   ruby -Ilib bench/scale.rb
#
# The generated files go to BENCH_DIR (tmp/scale), and are kept for the
# next run with the same settings.

require "json"
require "fileutils"
require "rbconfig"
require "open3"
require_relative "bench_helper"
require_relative "scale_data"

module ScaleBench
  ROOT = File.expand_path("..", __dir__)
  EXE = File.join(ROOT, "exe/strobe")
  SAMPLES = Bench.env_int("BENCH_SAMPLES", 10_000_000)
  THREADS = Bench.env_int("BENCH_THREADS", 8)
  DEPTH = Bench.env_int("BENCH_DEPTH", 20)
  STACKS = Bench.env_int("BENCH_STACKS", 200_000)
  FILES = Bench.env_int("BENCH_FILES", 100)
  FILE_SAMPLES = Bench.env_int("BENCH_FILE_SAMPLES", 100_000)
  PEER_GB = Bench.env_int("BENCH_PEER_GB", 8)
  PEER_SECONDS = Bench.env_int("BENCH_PEER_SECONDS", 600)
  DIR = File.expand_path(ENV.fetch("BENCH_DIR", File.join(ROOT, "tmp/scale")))

  module_function

  # [seconds, peak resident MB, exit status] of a command.
  def measure(*command, limit_gb: nil)
    shell = command.map { |a| "'#{a.gsub("'", "'\\\\''")}'" }.join(" ")
    shell = "ulimit -v #{limit_gb * 1024 * 1024}; exec #{shell}" if limit_gb
    _, err, status = Open3.capture3("/usr/bin/time", "-f", "@@ %e %M", "timeout", PEER_SECONDS.to_s, "sh", "-c", shell)
    seconds, kb = err.lines.grep(/\A@@ /).last.to_s.split.drop(1)
    why = err.lines.grep_v(/\A@@ |\ACommand (exited|terminated)/).last.to_s.strip
    [seconds.to_f, kb.to_i / 1024.0, status.exitstatus || 1, why]
  end

  def strobe(*args)
    [RbConfig.ruby, "-I#{File.join(ROOT, 'lib')}", EXE, *args]
  end

  def generated(name, seed, **shape)
    path = File.join(DIR, "#{name}-#{shape.values.join('-')}.json")
    unless File.exist?(path)
      start = Bench.now
      nodes = ScaleData.new(seed).write("#{path}.tmp", **shape)
      File.rename("#{path}.tmp", path)
      File.write("#{path}.nodes", nodes.to_s)
      warn format("generated %s: %d nodes, %.0f MB, %.1f s", File.basename(path), nodes, File.size(path) / 1e6, Bench.now - start)
    end
    [path, File.read("#{path}.nodes").to_i]
  end

  # The merged profile's compact size (Strobe::Stacks#bytesize: nodes and
  # columns), merged in a process of its own.
  def merged_bytes(files)
    code = "puts Strobe::Merge.results(ARGV.lazy.map { |f| Strobe.load(f) })[:stacks].bytesize"
    out, err, status = Open3.capture3(RbConfig.ruby, "-I#{File.join(ROOT, 'lib')}", "-rstrobe", "-e", code, *files)
    raise "merging failed: #{err}" unless status.success?

    out.to_i
  end

  def row(what, result, compact_mb)
    seconds, mb, status, last = result
    done = if status.zero? then format("%8.1f s  %8.0f MB  %6.1f x", seconds, mb, mb / compact_mb)
           elsif status == 124 then format("given up after %d s, at %.0f MB", PEER_SECONDS, mb)
           else "did not finish: #{last[0, 60]}"
           end
    puts format("%-44s %s", what, done)
  end

  def run
    FileUtils.mkdir_p(DIR)
    path, nodes = generated("one", 1, samples: SAMPLES, threads: THREADS, depth: DEPTH, stacks: STACKS)
    compact_mb = merged_bytes([path]) / 1e6
    puts "One profile: #{SAMPLES} samples, #{THREADS} threads, #{nodes} stack nodes; compact size #{compact_mb.round} MB"
    out = File.join(DIR, "out")
    row("strobe report --text", measure(*strobe("report", "--text", "--limit", "30", path)), compact_mb)
    row("strobe report --flamegraph", measure(*strobe("report", "--flamegraph", "-o", "#{out}.html", path)), compact_mb)
    puts format("%-44s %8.1f MB", "  flamegraph file", File.size("#{out}.html") / 1e6) if File.exist?("#{out}.html")
    row("strobe report --pprof", measure(*strobe("report", "--pprof", "-o", "#{out}.pb.gz", path)), compact_mb)
    # stackprof's text report reads only the frames; its folded stacks
    # need the raw arrays, which Strobe.load builds when they are read.
    peer = lambda do |call|
      [RbConfig.ruby, "-I#{File.join(ROOT, 'lib')}", "-rstrobe", "-rstackprof", "-e",
       "StackProf::Report.new(Strobe.load(ARGV[0])).#{call}", path]
    end
    row("stackprof Report#print_text (#{PEER_GB} GB cap)",
        measure(*peer.call("print_text(false, 30, nil, nil, nil, nil, File.open(File::NULL, 'w'))"), limit_gb: PEER_GB),
        compact_mb)
    row("stackprof Report#print_stackcollapse (#{PEER_GB} GB cap)",
        measure(*peer.call("tap { $stdout.reopen(File::NULL) }.print_stackcollapse"), limit_gb: PEER_GB), compact_mb)

    files = (1..FILES).map do |i|
      generated("part#{i}", 100 + i, samples: FILE_SAMPLES, threads: THREADS, depth: DEPTH, stacks: STACKS / 20).first
    end
    merged_mb = merged_bytes(files) / 1e6
    puts "", "A merge: #{FILES} files of #{FILE_SAMPLES} samples (#{FILES * FILE_SAMPLES} in all); " \
             "merged compact size #{merged_mb.round} MB"
    row("strobe report --text (#{FILES} files)", measure(*strobe("report", "--text", "--limit", "30", *files)), merged_mb)
  end
end

ScaleBench.run if $PROGRAM_NAME == __FILE__
