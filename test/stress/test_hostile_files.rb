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
      assert_refused(bomb, /decompresses to more than 1024 MB/)
    end
  end
end
