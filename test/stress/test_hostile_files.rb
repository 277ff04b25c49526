# frozen_string_literal: true

# `strobe report` on files that are not profiles, or are hostile: one line
# on stderr naming the file and the problem, exit status 1, nothing on
# stdout, never a backtrace. Run as the real command, in child processes.
require "test_helper"
require "tmpdir"
require "zlib"
require "json"

class TestHostileFiles < Minitest::Test
  STROBE = File.join(StrobeTestHelpers::ROOT, "exe", "strobe")

  def report(path, *options)
    run_command({}, RbConfig.ruby, "-I#{ENV['STROBE_LIB'] || LIB}", "-I#{LIB}", STROBE, "report", path, *options,
                timeout: 300)
  end

  def assert_refused(path, pattern, *options)
    out, err, status = report(path, *options)
    assert_equal 1, status.exitstatus, "#{path}: #{err[0, 500]}"
    assert_equal "", out
    assert_equal 1, err.lines.size, "one line, got:\n#{err[0, 2000]}"
    assert_match(/\Astrobe: cannot read profile #{Regexp.escape(path)}: .*#{pattern}/, err)
  end

  def test_missing_empty_and_directory
    Dir.mktmpdir do |dir|
      assert_refused(File.join(dir, "missing.json"), /No such file/)
      File.write(File.join(dir, "empty.json"), "")
      assert_refused(File.join(dir, "empty.json"), /empty/)
      assert_refused(dir, /Is a directory/)
    end
  end

  def test_truncated_and_random_bytes
    Dir.mktmpdir do |dir|
      good = JSON.generate(Strobe::ProfileFile.encode(Strobe.run(mode: :custom, raw: true) { Strobe.sample }))
      rng = Random.new(11)
      files = {
        "truncated.json" => good[0, good.size * 2 / 3],
        "truncated.json.gz" => Zlib.gzip(good)[0, 25],
        "random.bin" => rng.bytes(4096),
        "random.json" => "{" + rng.bytes(300),
        "binary_zeros" => "\0" * 10_000,
      }
      files.each do |name, bytes|
        path = File.join(dir, name)
        File.binwrite(path, bytes)
        assert_refused(path, /\S/)
      end
    end
  end

  def test_deeply_nested
    Dir.mktmpdir do |dir|
      path = File.join(dir, "nested.json")
      File.write(path, "[" * 200_000 + "]" * 200_000)
      assert_refused(path, /not valid JSON/)
      inside = File.join(dir, "nested_metadata.json")
      File.write(inside, %({"strobe_file":1,"mode":"wall","samples":1,"frames":[],"metadata":#{'{"a":' * 50_000}1#{'}' * 50_000}}))
      assert_refused(inside, /not valid JSON/)
    end
  end

  # A 100 MB document: refused for what it is, in bounded time and memory.
  def test_huge_files
    Dir.mktmpdir do |dir|
      path = File.join(dir, "huge.json")
      File.open(path, "w") do |f|
        f.write('{"strobe_file":1,"mode":"wall","samples":1,"frames":[')
        frame = '{"id":1,"name":"x","file":"y","total_samples":"many","samples":1},'
        (100_000_000 / frame.size).times { f.write(frame) }
        f.write('{"id":2}]}')
      end
      assert_refused(path, /frame 1 .*total_samples is not a non-negative integer/)
      bomb = File.join(dir, "bomb.json.gz")
      Zlib::GzipWriter.open(bomb) { |gz| 1100.times { gz.write(" " * (1 << 20)) } }
      assert_refused(bomb, /decompresses to more than \d+ MB, over 256 times its own size/)
    end
  end

  # --- files that describe far more than they hold -------------------------------

  # `strobe report` with its address space limited to 1.5 GB (on the plain
  # build, without the sanitizer runtime, which reserves terabytes), so a
  # file that makes it expand without limit fails the test instead of
  # swapping: [stdout, stderr, status].
  def report_limited(path, *options)
    env = { "LD_PRELOAD" => nil, "ASAN_OPTIONS" => nil, "UBSAN_OPTIONS" => nil, "STROBE_LIB" => nil }
    run_command(env, RbConfig.ruby, "-I#{LIB}", STROBE, "report", path, *options, timeout: 300, rlimit_as: 3 << 29)
  end

  # A Strobe profile document (ProfileFile.encode's layout): a chain of
  # depth nodes, two leaves under it, samples alternating between them,
  # with deltas (from deltas, a block giving each) and a thread each.
  def chain_doc(depth, samples, &deltas)
    nodes = []
    depth.times { |k| nodes.push(k, 0, 1) }
    nodes.push(depth, 1, 2, depth, 2, 3)
    stacks = { start_time: 0, nodes: nodes, samples: Array.new(samples) { |i| depth + 1 + (i % 2) }, deltas: [],
               threads: [] }
    stacks.update(deltas: Array.new(samples, &deltas), threads: Array.new(samples, 0)) if deltas
    { strobe_file: 1, mode: "wall", interval: 1000, samples: samples, gc_samples: 0, missed_samples: 0,
      frames: [{ id: 1, name: "chain", file: "a.rb", line: 1, total_samples: samples, samples: 0 },
               { id: 2, name: "a", file: "a.rb", line: 2, total_samples: samples / 2, samples: samples / 2 },
               { id: 3, name: "b", file: "a.rb", line: 3, total_samples: samples / 2, samples: samples / 2 }],
      threads: [{ id: 1, name: "main", samples: samples, main: true }], stacks: stacks }
  end

  # The review's files: 24 KB (10,000 deep, 10,000 samples: 1.6 GB when
  # expanded) and 47 KB (20,000 deep, 40,000 samples: 13 GB); a column of
  # zero deltas under a 380-deep chain (1.2 GB from 3 KB): reported from
  # their compact form in bounded memory, and one line for what would
  # expand them (stackprof's JSON layout). A stackprof result claiming a
  # billion samples in one run: one line.
  def test_small_files_describing_huge_profiles
    Dir.mktmpdir do |dir|
      files = {
        "review.json.gz" => chain_doc(10_000, 10_000),
        "review47.json.gz" => chain_doc(20_000, 40_000),
        "zeros.json.gz" => chain_doc(380, 200_000) { 0 },
      }
      files.each do |name, doc|
        path = File.join(dir, name)
        File.binwrite(path, Zlib.gzip(JSON.generate(doc), level: 9))
        out, err, status = report_limited(path)
        assert_equal [0, ""], [status.exitstatus, err], name
        assert_match(/Samples: #{doc[:samples]} /, out, name)
        %w[--stackcollapse --flamegraph --pprof].each do |format|
          _, err, status = report_limited(path, format, "-o", File.join(dir, "out"))
          assert_equal [0, ""], [status.exitstatus, err], "#{name} #{format}"
        end
        out, err, status = report_limited(path, "--json")
        assert_equal [1, "", 1], [status.exitstatus, out, err.lines.size], "#{name}: #{err[0, 600]}"
        assert_match(/\Astrobe: cannot report on #{Regexp.escape(path)}: its \d+ samples' stacks would expand to /, err)
      end
      path = File.join(dir, "stackprof.json")
      File.write(path, JSON.generate(mode: "wall", interval: 1000, samples: 10**9, frames: { "1" => { name: "x" } },
                                     raw: [1, 1, 10**9]))
      %w[--speedscope --firefox --pprof --timeline-flamegraph].each do |format|
        out, err, status = report_limited(path, format)
        assert_equal [1, "", 1], [status.exitstatus, out, err.lines.size], "#{format}: #{err[0, 600]}"
        assert_match(/\Astrobe: cannot read profile .*: raw counts more than \d+ samples/, err)
      end
    end
  end

  # A file at the limit past its floor, shaped as Strobe writes them (a
  # delta with some jitter and a thread a sample): 50,000 samples on
  # alternating leaves under a 380-deep chain expand to 19.15 million raw
  # entries, within 128 per number. It loads, and every report on it runs
  # within 1.5 GB (it measured 320 MB, 470 MB for --json).
  def test_reports_on_a_file_at_the_limit
    Dir.mktmpdir do |dir|
      rng = Random.new(3)
      path = File.join(dir, "limit.json.gz")
      File.binwrite(path, Zlib.gzip(JSON.generate(chain_doc(380, 50_000) { 1000 + rng.rand(-40..40) })))
      %w[--text --files --stackcollapse --flamegraph --timeline-flamegraph --speedscope --firefox --pprof --json
         --callgrind --graphviz].each do |format|
        out_path = File.join(dir, "out")
        out, err, status = report_limited(path, format, "-o", out_path)
        assert_equal [0, "", ""], [status.exitstatus, out, err], format
        assert_operator File.size(out_path), :>, 0, format
      end
      out, err, status = report_limited(path, "--method", "chain")
      assert_equal 0, status.exitstatus, err
      assert_match(/50000 total \(100\.0%\)/, out)
    end
  end
end
