# frozen_string_literal: true

# Small files that describe huge profiles: loading and reporting them stays
# within a bounded multiple of what the file really holds, or stops with
# Strobe::ProfileError (one `strobe: ...` line from the CLI). What would
# blow up without the limits runs in a child process whose address space is
# limited, so a missing limit fails the test instead of swapping.
require "test_helper"
require "json"
require "zlib"
require "stringio"
require "tmpdir"

class TestLoadLimits < Minitest::Test
  STROBE = File.join(StrobeTestHelpers::ROOT, "exe", "strobe")
  FLOOR = Strobe::Native::EXPAND_FLOOR
  PER_NUMBER = Strobe::Native::EXPAND_PER_NUMBER
  PER_BYTE = Strobe::Native::EXPAND_PER_BYTE
  # A child's address space: well above what the limited work needs (Ruby
  # and the extension take about 200 MB of it), well below what the
  # unlimited work needed (1.6 GB and more).
  CHILD_LIMIT = 1 << 30

  def setup
    super
    @dir = Dir.mktmpdir("strobe-limits")
  end

  def teardown
    FileUtils.remove_entry(@dir) if @dir
    super
  end

  def path(name)
    File.join(@dir, name)
  end

  # A Strobe profile document as ProfileFile.encode writes it: frame 0 (the
  # chain's), 1 and 2 (leaves); a chain of depth nodes, a leaf under its
  # last node for each of frames 1 and 2, and samples alternating between
  # the two leaves, with a delta and a thread each when columns.
  def chain_doc(depth:, samples:, columns: false, name: "chain")
    nodes = []
    depth.times { |k| nodes.push(k, 0, 1) }
    nodes.push(depth, 1, 2, depth, 2, 3)
    stacks = { start_time: 0, nodes: nodes, samples: Array.new(samples) { |i| depth + 1 + (i % 2) },
               deltas: [], threads: [] }
    stacks.update(deltas: Array.new(samples, 1000), threads: Array.new(samples, 0)) if columns
    { strobe_file: 1, version: 1.2, mode: "wall", interval: 1000, samples: samples, gc_samples: 0,
      missed_samples: 0, metadata: {},
      frames: [{ id: 11, name: name, file: "a.rb", total_samples: samples, samples: 0 },
               { id: 12, name: "a", file: "a.rb", total_samples: samples / 2, samples: samples / 2 },
               { id: 13, name: "b", file: "a.rb", total_samples: samples - samples / 2, samples: samples - samples / 2 }],
      threads: columns ? [{ id: 1, name: "main", samples: samples, main: true }] : [],
      stacks: stacks }
  end

  # The raw entries chain_doc's samples expand to: per sample (each on
  # another leaf than the one before) the leaf's depth + 1 frames, + 2.
  def chain_entries(depth, samples)
    samples * (depth + 3)
  end

  def write_gz(name, doc)
    File.binwrite(path(name), Zlib.gzip(JSON.generate(doc), level: 9))
    path(name)
  end

  # Runs command with its address space limited to limit bytes, its
  # standard output to out (a path; /dev/null by default), in a child:
  # [stderr, status]. Killed after timeout seconds (a guard against a hang,
  # not a timing check). On the plain build, without the sanitizer runtime
  # `rake test:asan` preloads: that reserves terabytes of address space.
  def run_limited(*command, limit: CHILD_LIMIT, out: File::NULL, input: File::NULL, timeout: 300)
    err = path("stderr-#{rand(1 << 30)}")
    env = { "LD_PRELOAD" => nil, "ASAN_OPTIONS" => nil, "UBSAN_OPTIONS" => nil, "STROBE_LIB" => nil }
    pid = Process.spawn(env, *command, in: input, out: out, err: err, rlimit_as: limit, pgroup: true)
    waiter = Process.detach(pid)
    unless waiter.join(timeout)
      Process.kill(:KILL, -pid)
      waiter.join
      flunk "#{command.join(' ')} did not finish within #{timeout}s"
    end
    [File.read(err), waiter.value]
  end

  # The command on the plain build (see run_limited).
  def strobe_command(*args)
    [RbConfig.ruby, "-I#{StrobeTestHelpers::LIB}", STROBE, *args]
  end

  def assert_one_line(err, status, pattern)
    assert_equal 1, status.exitstatus, "stderr: #{err[0, 600]}"
    assert_equal 1, err.lines.size, "one line, got:\n#{err[0, 2000]}"
    assert_match pattern, err
  end

  EXPAND_ERROR = /stacks would expand to (\d+) raw entries, over this file's limit of (\d+) /

  # Out of memory short of the limit (a machine that gives less): still
  # one line, not Ruby's NoMemoryError report. (Stackprof's JSON layout
  # builds the raw arrays; the text report no longer does.)
  def test_running_out_of_memory_is_one_line
    depth = 1021
    at = write_gz("at.json.gz", chain_doc(depth: depth, samples: FLOOR / (depth + 3)))
    err, status = run_limited(*strobe_command("report", "--json", at), limit: 300 << 20)
    assert_one_line(err, status, /\Astrobe: out of memory \(report\)/)
  end

  # --- the stacks section ---------------------------------------------------

  # The review's chain, 10,000 deep, under samples alternating between two
  # leaves: 1,700 of them expand to 17 million raw entries (10,000 made
  # 1.6 GB, from a 24 KB file). It loads, in its compact form; its raw
  # arrays are refused before anything is expanded.
  def test_a_deep_chain_repeated_by_many_samples_is_refused
    file = write_gz("deep.json.gz", chain_doc(depth: 10_000, samples: 1700))
    assert_operator File.size(file), :<, 30_000
    loaded = Strobe.load(file)
    assert_equal 1700, loaded[:stacks].size
    error = assert_raises(Strobe::ProfileError) { loaded[:raw] }
    assert_match(/\Aits 1700 samples' stacks would expand to 17005100 raw entries, /, error.message)
    # Refused every time, not once (the review's: then nil, silently).
    assert_raises(Strobe::ProfileError) { loaded[:raw] }
    assert_raises(Strobe::ProfileError) { Strobe.expand(loaded) }
    error = assert_raises(Strobe::ProfileError) { Strobe::Merge.results([loaded, loaded])[:raw] }
    assert_match(/would expand/, error.message, "nor those of a merge with it")
    assert_match(/over this file's limit of #{FLOOR} \(#{PER_NUMBER} per number of its stacks section and #{PER_BYTE} per byte of the file, at least #{FLOOR}\)\z/,
                 error.message)
  end

  # The review's file itself (24 KB gzipped, 10,000 samples: 100 million
  # raw entries, 1.6 GB and 6.8 s), through the command, in a child with
  # 1 GB of address space: reported from its compact form (before, loading
  # expanded it and ran out of memory); what would expand it, stackprof's
  # JSON layout, is one line.
  def test_the_command_reports_it_in_bounded_memory
    file = write_gz("deep.json.gz", chain_doc(depth: 10_000, samples: 10_000))
    assert_operator File.size(file), :<, 30_000
    out = path("out")
    err, status = run_limited(*strobe_command("report", file), out: out)
    assert_equal [0, ""], [status.exitstatus, err]
    assert_match(/Samples: 10000 /, File.read(out))
    err, status = run_limited(*strobe_command("report", "--flamegraph", "-o", path("f.html"), file))
    assert_equal [0, ""], [status.exitstatus, err]
    err, status = run_limited(*strobe_command("report", "--json", file))
    assert_one_line(err, status, /\Astrobe: cannot report on #{Regexp.escape(file)}: its 10000 samples' stacks would expand/)

    # Merged with another: folded stacks of both.
    good = path("good.json")
    File.write(good, JSON.generate(chain_doc(depth: 3, samples: 4)))
    err, status = run_limited(*strobe_command("report", good, file, "--stackcollapse"), out: out)
    assert_equal [0, ""], [status.exitstatus, err]
    assert_equal 10_004, File.readlines(out).sum { |line| line.split.last.to_i }
  end

  # Exactly at the limit loads (and raw holds exactly what was added up:
  # a sample on the same node as the one before adds nothing); one sample
  # more on another leaf is refused. The floor needs 2**24 entries, so the
  # load that succeeds runs in a child (about 270 MB).
  def test_the_limit_is_exact
    depth = 1021 # a leaf is 1,022 deep: 1,024 entries a sample
    samples = FLOOR / (depth + 3)
    assert_equal FLOOR, chain_entries(depth, samples)
    doc = chain_doc(depth: depth, samples: samples)
    doc[:stacks][:samples] << doc[:stacks][:samples].last # same node: same run
    doc[:samples] += 1
    at = write_gz("at.json.gz", doc)
    code = <<~RUBY
      require "strobe"
      r = Strobe.load(ARGV[0])
      print r[:raw].size, " ", r[:raw].each_slice(#{depth + 3}).sum(&:last)
    RUBY
    # (The raw arrays are built as they are read: that is what is limited.)
    out, err, status = run_ruby(code, args: [at], timeout: 300)
    assert status.success?, err[0, 600]
    assert_equal "#{FLOOR} #{samples + 1}", out

    doc[:stacks][:samples] << doc[:stacks][:samples].first # another leaf: 1,024 more
    over = write_gz("over.json.gz", doc)
    error = assert_raises(Strobe::ProfileError) { Strobe.load(over)[:raw] }
    assert_match EXPAND_ERROR, error.message
    assert_equal [FLOOR + depth + 3, FLOOR], error.message.match(EXPAND_ERROR).captures.map(&:to_i)
  end

  # Past the floor the limit grows with the numbers the file gives: a
  # profile as Strobe writes it (a node, a delta and a thread a sample)
  # whose stacks average up to about 380 frames loads however long it is
  # (test/stress/test_hostile_files.rb loads one); 400 deep, every sample
  # on another stack, it is refused.
  def test_past_the_floor_the_limit_is_per_number
    samples = 50_000
    doc = chain_doc(depth: 400, samples: samples, columns: true)
    numbers = 3 * 402 + 3 * samples
    error = assert_raises(Strobe::ProfileError) { Strobe::ProfileFile.parse(JSON.generate(doc), "p")[:raw] }
    assert_equal [chain_entries(400, samples), PER_NUMBER * numbers], error.message.match(EXPAND_ERROR).captures.map(&:to_i)
    assert_operator PER_NUMBER * numbers, :>, FLOOR
  end

  # gzip makes numbers nearly free: a column of zeros compresses to nothing.
  # 200,000 samples with a zero delta and thread each, alternating under a
  # 380-deep chain, are within 128 entries per number (76.6 million entries,
  # 1.2 GB) but come from a 3 KB file: over 1,024 per byte of it, refused.
  # Without that limit the child ran out of its 1 GB.
  def test_past_the_floor_the_limit_is_also_per_byte_of_the_file
    samples = 200_000
    doc = chain_doc(depth: 380, samples: samples, columns: true)
    doc[:stacks][:deltas].fill(0)
    file = write_gz("zeros.json.gz", doc)
    assert_operator chain_entries(380, samples), :<=, PER_NUMBER * (3 * 382 + 3 * samples)
    assert_operator chain_entries(380, samples), :>, [FLOOR, PER_BYTE * File.size(file)].max
    script = path("load.rb")
    File.write(script, <<~RUBY)
      require "strobe"
      begin
        Strobe.load(ARGV[0])[:raw]
        puts "loaded"
      rescue Strobe::ProfileError => e
        puts e.message
      end
    RUBY
    out = path("out")
    err, status = run_limited(RbConfig.ruby, "-I#{StrobeTestHelpers::LIB}", script, file, out: out)
    assert status.success?, "stderr: #{err[0, 600]}"
    assert_equal [chain_entries(380, samples), FLOOR], File.read(out).match(EXPAND_ERROR)&.captures&.map(&:to_i),
                 File.read(out)
  end

  def test_the_limit_function
    assert_equal FLOOR, Strobe::Native.expand_limit(0, nil)
    assert_equal PER_NUMBER * 1_000_000, Strobe::Native.expand_limit(1_000_000, nil)
    assert_equal FLOOR, Strobe::Native.expand_limit(1_000_000, 10_000)
    assert_equal PER_BYTE * 100_000, Strobe::Native.expand_limit(1_000_000, 100_000)
    assert_equal PER_NUMBER * 1_000_000, Strobe::Native.expand_limit(1_000_000, 2**80)
    assert_equal 2**64 - 1, Strobe::Native.expand_limit(2**62, nil)
    assert_equal 2**64 - 1, Strobe::Native.expand_limit(2**70, 2**70)
    assert_raises(ArgumentError) { Strobe::Native.expand_limit(-1, nil) }
    assert_raises(ArgumentError) { Strobe::Native.expand_limit(1, "1") }
  end

  # --- reports -------------------------------------------------------------------

  # Within the limit, folded stacks name every frame of every distinct
  # stack: 1,500 stacks up to 1,500 frames deep of a 1,000-byte name make
  # 1.1 GB of lines from a 12 KB file. They go to the output as they are
  # written; built whole first, they ran out of the child's 1 GB.
  def test_folded_stacks_are_streamed
    depth = 1500
    doc = chain_doc(depth: depth, samples: 0, name: "x" * 1000)
    doc[:stacks][:samples] = (1..depth).to_a
    doc[:samples] = doc[:frames][0][:total_samples] = doc[:frames][0][:samples] = depth
    file = write_gz("names.json.gz", doc)
    assert_operator File.size(file), :<, 20_000
    err, status = run_limited(*strobe_command("report", "--stackcollapse", file))
    assert status.success?, "stderr: #{err[0, 600]}"
    assert_equal "", err
  end

  def test_folded_stacks_to_an_io_are_what_the_string_holds
    result = Strobe::ProfileFile.parse(JSON.generate(chain_doc(depth: 40, samples: 7, name: "c;h\nain")), "p")
    string = Strobe::Native.report_folded(result, nil)
    io = StringIO.new
    assert_same io, Strobe::Native.report_folded(result, nil, io)
    assert_equal string, io.string
    assert_equal 2, string.lines.size
    io = StringIO.new
    Strobe::Report.new(result).print_stackcollapse(io)
    assert_equal string, io.string
  end

  # Chunks handed to the sink while names (some of them copies made to
  # escape them) are still being written, GC at every allocation, with
  # compaction on (test_helper): the same lines.
  def test_folded_stacks_survive_gc_while_streaming
    depth = 300
    doc = chain_doc(depth: depth, samples: 0, name: "n;\e#{'x' * 100}")
    doc[:stacks][:samples] = (1..depth).to_a
    doc[:samples] = depth
    result = Strobe::ProfileFile.parse(JSON.generate(doc), "p")
    string = Strobe::Native.report_folded(result, nil)
    assert_operator string.bytesize, :>, 3 * (1 << 20) # several chunks
    io = StringIO.new
    under_gc_stress { Strobe::Native.report_folded(result, nil, io) }
    assert_equal string, io.string
  end

  # --- gzip ------------------------------------------------------------------------

  # 40 MB of blanks around a valid profile, gzipped to 40 KB: more than 256
  # times its size and over the 32 MB floor. It loaded before (a gzip file
  # could inflate to 1 GB whatever its size).
  def test_a_gzip_bomb_is_refused
    json = JSON.generate(chain_doc(depth: 3, samples: 4))
    File.binwrite(path("bomb.json.gz"), Zlib.gzip(json.sub("{", "{" + " " * (40 << 20)), level: 9))
    error = assert_raises(Strobe::ProfileError) { Strobe.load(path("bomb.json.gz")) }
    assert_match(/: decompresses to more than 32 MB, over 256 times its own size .*once gunzipped\z/, error.message)

    # The same blanks in a plain file are what they are.
    File.write(path("blank.json"), json.sub("{", "{" + " " * (40 << 20)))
    assert_equal 4, Strobe.load(path("blank.json"))[:samples]
    # Under the floor, a file may be as repetitive as it likes.
    File.binwrite(path("small.json.gz"), Zlib.gzip(json.sub("{", "{" + " " * (30 << 20)), level: 9))
    assert_equal 4, Strobe.load(path("small.json.gz"))[:samples]
  end

  # --- input without end ------------------------------------------------------------

  # Room for the limit on a profile's size (1 GB, read once) and Ruby.
  ENDLESS_LIMIT = 2 << 30

  # /dev/zero, or a pipe that never ends: read up to the most a profile may
  # be, then refused in one line. They were read until memory ran out.
  def test_input_without_end_is_read_to_the_limit
    err, status = run_limited(*strobe_command("report", "/dev/zero"), limit: ENDLESS_LIMIT)
    assert_one_line(err, status, %r{\Astrobe: cannot read profile /dev/zero: larger than 1024 MB, the most a profile may be$})

    reader, writer = IO.pipe
    # (It writes until the pipe's reader has gone, and is killed after.)
    yes = Process.spawn(RbConfig.ruby, "-e", "chunk = %(y\n) * 32_768; $stdout.write(chunk) while true",
                        out: writer, err: File::NULL)
    writer.close
    err, status = run_limited(*strobe_command("report", "/dev/stdin"), limit: ENDLESS_LIMIT, input: reader)
    assert_one_line(err, status, %r{\Astrobe: cannot read profile /dev/stdin: larger than 1024 MB, the most a profile may be$})
  ensure
    reader&.close
    if yes
      Process.kill(:KILL, yes)
      Process.wait(yes)
    end
  end

  # A profile through a pipe is read once (--marshal looks at its first
  # bytes for its warning, and no longer takes them from the pipe). Its
  # size unknown, the read reserves room for the most a profile may be
  # (address space, not memory: untouched but for what comes).
  def test_a_profile_through_a_pipe
    json = JSON.generate(chain_doc(depth: 3, samples: 4))
    reader, writer = IO.pipe
    writer.write(json)
    writer.close
    out = path("out")
    err, status = run_limited(*strobe_command("report", "--marshal", "/dev/stdin"), limit: ENDLESS_LIMIT, input: reader,
                                                                                       out: out)
    assert_equal ["", 0], [err, status.exitstatus]
    assert_match(/Samples: 4 /, File.read(out))
  ensure
    reader&.close
  end

  # --- raw arrays taken as they are ----------------------------------------------

  def stackprof_doc(count, **extra)
    { mode: "wall", interval: 1000, samples: count, gc_samples: 0, missed_samples: 0,
      frames: { "1" => { name: "x", file: "y", total_samples: count, samples: count } },
      raw: [1, 1, count], **extra }
  end

  # A stackprof result says per run how many samples it had; exports expand
  # every sample (a billion, in a 200-byte file, had them allocate 4 GB at
  # once, and more after). Counts are held to the same limit as Strobe's
  # files: the floor, or 128 per number (and 1,024 per byte).
  def test_raw_counts_of_a_stackprof_result_are_limited
    File.write(path("sp.json"), JSON.generate(stackprof_doc(1_000_000_000)))
    error = assert_raises(Strobe::ProfileError) { Strobe.load(path("sp.json")) }
    assert_match(/\A#{Regexp.escape(path('sp.json'))}: raw counts more than #{FLOOR} samples, over this file's limit /,
                 error.message)

    err, status = run_limited(*strobe_command("report", "--speedscope", path("sp.json")))
    assert_one_line(err, status, /\Astrobe: cannot read profile .*sp\.json: raw counts more than/)

    # Up to the floor it loads, and its export has them all.
    File.write(path("ok.json"), JSON.generate(stackprof_doc(100_000)))
    result = Strobe.load(path("ok.json"))
    assert_equal [1, 1, 100_000], result[:raw]
    io = StringIO.new
    Strobe::Report.new(result).print_speedscope(io)
    assert_equal [100_000_000], JSON.parse(io.string)["profiles"][0]["weights"]

    # Per-sample arrays are numbers the file gives: as many samples load.
    stamps = Array.new(FLOOR / PER_NUMBER + 1) { |i| i * 1000 }
    File.write(path("stamps.json"), JSON.generate(stackprof_doc(stamps.size * PER_NUMBER, raw_sample_timestamps: stamps)))
    assert_equal stamps.size * PER_NUMBER, Strobe.load(path("stamps.json"))[:raw].last
  end

  # A Strobe file without a stacks section keeps a raw array it holds; so
  # does a Marshal dump (stackprof's own files, read with marshal: true).
  def test_raw_counts_of_other_results_are_limited
    doc = chain_doc(depth: 1, samples: 1)
    doc.delete(:stacks)
    doc[:raw] = [1, 11, 1 << 40]
    File.write(path("strobe.json"), JSON.generate(doc))
    assert_raises(Strobe::ProfileError) { Strobe.load(path("strobe.json")) }

    File.binwrite(path("dump"), Marshal.dump(stackprof_doc(1 << 40).merge(frames: { 1 => { name: "x" } })))
    error = assert_raises(Strobe::ProfileError) { Strobe.load(path("dump"), marshal: true) }
    assert_match(/raw counts more than/, error.message)
    File.binwrite(path("dump"), Marshal.dump(stackprof_doc(5).merge(frames: { 1 => { name: "x" } })))
    assert_equal [1, 1, 5], Strobe.load(path("dump"), marshal: true)[:raw]
  end

  # What Strobe writes loads back: a profile with stacks 300 deep, samples
  # alternating between two leaves.
  def test_a_deep_profile_strobe_wrote_loads
    result = Strobe.run(mode: :custom, raw: true) do
      deep = lambda do |n|
        next deep.(n - 1) if n.positive?

        200.times { |i| i.even? ? Strobe.sample : [1].each { Strobe.sample } }
      end
      deep.(300)
    end
    Strobe.save(result, path("deep.json.gz"))
    loaded = Strobe.load(path("deep.json.gz"))
    assert_equal result[:raw], loaded[:raw]
    assert_operator result[:raw].size, :>, 200 * 300
  end
end
