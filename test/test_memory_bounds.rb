# frozen_string_literal: true

require_relative "test_helper"
require_relative "../bench/scale_data"
require "tmpdir"

# Profiles of any size (issue 22): a report or an export of a profile holds
# about three times the profile's compact form (Strobe::Stacks#bytesize:
# its node table and per-sample columns) beyond what the process held
# before, plus its output; a merge about that of the merged profile,
# however many files went in. Each command runs in a process of its own,
# its peak resident memory (VmHWM, reset through /proc/self/clear_refs once
# Strobe is loaded) taken against its resident memory then: a ratio, never
# a time.
class TestMemoryBounds < Minitest::Test
  # Up to this many times the compact size, beyond the output: the measured
  # ratios are about 2 to 3 (docs/performance.md); the rest is room for
  # the allocator and the GC of the Rubies CI runs.
  BOUND = 4.0
  # The flamegraph's page is built as data and JSON text in Ruby (about
  # twice its size) before it is written.
  PAGE_COPIES = 2

  # In the child: runs `strobe ARGV...` in this process and prints its peak
  # memory beyond the memory before, the compact size of the profile it
  # read (the files merged, if several) and its output's size.
  MEASURE = <<~'RUBY'
    require "strobe"
    require "strobe/cli"
    status = ->(key) { File.read("/proc/self/status")[/^#{key}:\s+(\d+)/, 1].to_i * 1024 }
    GC.start
    File.write("/proc/self/clear_refs", "5") # VmHWM := VmRSS
    before = status.call("VmRSS")
    out = ARGV.include?("-o") ? ARGV[ARGV.index("-o") + 1] : nil
    code = Strobe::CLI.new(ARGV.dup).run
    peak = status.call("VmHWM")
    files = ARGV.select { |arg| arg.end_with?(".json") && arg != out }
    compact = Strobe::Merge.results(files.lazy.map { |file| Strobe.load(file) })[:stacks].bytesize
    warn ["@@", code, peak - before, compact, out ? File.size(out) : 0].join(" ")
  RUBY

  def setup
    skip "resident memory means nothing under a sanitizer or valgrind" if sanitized?
    skip "needs /proc/self/clear_refs to reset the peak" unless File.writable?("/proc/self/clear_refs")
    @dir = Dir.mktmpdir
    # 400,000 samples of 4 threads on 10,000 stacks 20 frames deep, most
    # samples on another stack than their thread's previous one.
    @profile = File.join(@dir, "profile.json")
    ScaleData.new(22).write(@profile, samples: 400_000, threads: 4, depth: 20, stacks: 10_000)
  end

  def teardown
    FileUtils.rm_rf(@dir) if @dir
  end

  def sanitized?
    ENV["STROBE_UNDER_VALGRIND"] || ENV["LD_PRELOAD"].to_s.include?("asan") || ENV.key?("ASAN_OPTIONS")
  end

  # [excess over the memory before, the profile's compact size, output size]
  def measure(*args)
    _, err, status = run_ruby(MEASURE, timeout: 300, args: ["report", *args])
    assert status.success?, "exit status #{status.inspect}, stderr: #{err[0, 600]}"
    code, excess, compact, size = err[/^@@ (.*)/, 1].to_s.split.map(&:to_i)
    assert_equal 0, code, err[0, 600]
    [excess, compact, size]
  end

  def assert_bounded(args, copies: 1)
    excess, compact, size = measure(*args)
    assert_operator compact, :>, 4_000_000, "the profile is the size this test means"
    ratio = (excess - copies * size).fdiv(compact)
    assert_operator ratio, :<=, BOUND,
                    format("strobe report %s held %.1f MB beyond %d x its %.1f MB output: %.2f times the %.1f MB compact form",
                           args.first, excess / 1e6, copies, size / 1e6, ratio, compact / 1e6)
  end

  def test_reports_hold_a_few_times_the_compact_form
    assert_bounded ["--text", @profile]
    assert_bounded ["--files", @profile]
    assert_bounded ["--callgrind", "-o", File.join(@dir, "out.callgrind"), @profile]
  end

  def test_exports_hold_a_few_times_the_compact_form_plus_their_output
    assert_bounded ["--pprof", "-o", File.join(@dir, "out.pb.gz"), @profile]
    assert_bounded ["--stackcollapse", "-o", File.join(@dir, "out.folded"), @profile]
    assert_bounded ["--firefox", "-o", File.join(@dir, "out.firefox.json"), @profile]
    assert_bounded ["--speedscope", "-o", File.join(@dir, "out.speedscope.json"), @profile]
  end

  def test_the_flamegraph_holds_a_few_times_the_compact_form_plus_its_page
    assert_bounded ["--flamegraph", "-o", File.join(@dir, "out.html"), @profile], copies: PAGE_COPIES
  end

  # Ten files merged as they are read: the merge holds the merged profile
  # and one input at a time, not the ten.
  def test_a_merge_streams
    parts = (1..10).map do |i|
      path = File.join(@dir, "part#{i}.json")
      ScaleData.new(100 + i).write(path, samples: 50_000, threads: 4, depth: 20, stacks: 2_000)
      path
    end
    assert_bounded ["--text", *parts]
  end
end
