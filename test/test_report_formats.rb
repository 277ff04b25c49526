# frozen_string_literal: true

require "test_helper"
require "stringio"
require "tmpdir"
require "json"

# Every report format of Strobe::Report and `strobe report`, checked against
# hand-computed answers and against the real programs that read them
# (Graphviz, callgrind_annotate, stackprof's own Report).
class TestReportFormats < Minitest::Test
  # Raw samples, root first: 5 x main>run>pow, 3 x main>run>concat,
  # 2 x main>run, 1 x main>run>pow again, then 2 GC samples.
  def raw_fixture
    raw = [3, 1, 2, 3, 5, 3, 1, 2, 4, 3, 2, 1, 2, 2, 3, 1, 2, 3, 1, 2, 5, 6, 2]
    frames = {
      1 => { name: "<main>", file: "/app/main.rb", line: 1 },
      2 => { name: "A#run", file: "/app/a.rb", line: 3 },
      3 => { name: "A#pow", file: "/app/a.rb", line: 9 },
      4 => { name: "A#concat;x", file: "/lib/str.rb", line: 13 },
      5 => { name: "(garbage collection)", file: "" },
      6 => { name: "(marking)", file: "" },
    }
    result = { version: 1.2, mode: :wall, interval: 1000, samples: 13, gc_samples: 2, missed_samples: 0,
               frames: frames, raw: raw, raw_lines: raw.map { |v| v }, raw_sample_threads: [7] * 13,
               raw_sample_timestamps: (1..13).map { |i| 1000 * i }, threads: { 7 => { name: "main", samples: 13 } } }
    # Aggregates derived by Strobe's own code, as for a file read back; the
    # raw arrays as stackprof has them (a result of Strobe's has its
    # compact form, which the tests of it cover).
    Strobe.expand(Strobe::Native.thread_subset(result, 7)).tap { |r| r.delete(:thread) }
  end

  def report(result = raw_fixture, **options)
    Strobe::Report.new(result, **options)
  end

  def output(report, method, *args, **options)
    io = StringIO.new
    report.public_send(method, io, *args, **options)
    io.string
  end

  def test_stackcollapse_folds_each_distinct_stack_once
    folded = output(report, :print_stackcollapse).lines.sort
    assert_equal ["(garbage collection);(marking) 2\n", "<main>;A#run 2\n", "<main>;A#run;A#concat:x 3\n",
                  "<main>;A#run;A#pow 6\n"], folded
  end

  def test_filters_drop_frames_from_stacks_and_tables
    filtered = report(reject_names: [/A#run/], reject_files: ["/lib"])
    assert_equal ["(garbage collection);(marking) 2\n", "<main> 5\n", "<main>;A#pow 6\n"],
                 output(filtered, :print_stackcollapse).lines.sort
    text = output(filtered, :print_text)
    refute_match(/A#run|A#concat/, text)
    assert_match(/A#pow/, text)
    only = report(select_files: ["/app/a.rb"])
    # A#concat is dropped: its 3 samples are A#run's.
    assert_equal ["A#run 5\n", "A#run;A#pow 6\n"], output(only, :print_stackcollapse).lines.sort
    assert_raises(ArgumentError) { report(select_everything: ["x"]) }
  end

  def test_stack_tree_counts_and_timeline
    tree = report.stack_tree
    names = tree[:frame_ids].map { |id| raw_fixture[:frames][id][:name] }
    pow = tree[:frame].each_index.find { |n| tree[:frame][n] >= 0 && names[tree[:frame][n]] == "A#pow" }
    assert_equal 6, tree[:self][pow]
    assert_equal 13, tree[:total][0]
    assert_equal 13, tree[:run_counts].sum
    # Time order: pow x5, concat x3, run x2, pow x1, GC x2.
    assert_equal [5, 3, 2, 1, 2], tree[:run_counts]
    assert_equal pow, tree[:run_nodes][0]
    assert_equal pow, tree[:run_nodes][3]
  end

  def test_stackcollapse_needs_raw_data
    no_raw = raw_fixture.reject { |k, _| k.to_s.start_with?("raw") }
    error = assert_raises(Strobe::ProfileError) { output(report(no_raw), :print_stackcollapse) }
    assert_match(/needs per-sample data/, error.message)
  end

  def test_corrupt_raw_raises_profile_error
    [[5, 1, 2], [3, 1, 2, 99, 1], [2, 1, 2, -1], ["x"]].each do |raw|
      assert_raises(Strobe::ProfileError, raw.inspect) { output(report(raw_fixture.merge(raw: raw)), :print_stackcollapse) }
    end
  end

  def test_files_counts_each_sample_once_per_file
    header, *lines = output(report, :print_files).lines
    assert_equal "     TOTAL    (pct)     SAMPLES    (pct)     FILE\n", header
    assert_equal header.index("(pct)     SAMPLES") + "(pct)".size, lines.first.index(")") + 1, "columns under their titles"
    rows = lines.map { |l| l.match(/\A *(\d+) +\(.*?\) +(\d+) +\(.*?\) +(.*)\n\z/) }
    by_file = rows.to_h { |m| [m[3], [m[1].to_i, m[2].to_i]] }
    # /app/a.rb: every stack but the GC ones has A#run (11), self A#pow 6 + A#run 2.
    assert_equal [11, 8], by_file["/app/a.rb"]
    assert_equal [11, 0], by_file["/app/main.rb"]
    assert_equal [3, 3], by_file["/lib/str.rb"]
    assert_equal [2, 2], by_file["(no file)"]
  end

  # A relative path names the file of the directory the profile was taken
  # in (cwd); without cwd, the one absolute path ending with it. Ruby's
  # names for code without a file are left alone.
  def test_relative_paths_are_resolved
    relative = lambda do |result|
      result[:frames][1] = result[:frames][1].merge(file: "main.rb")
      result[:frames][4] = result[:frames][4].merge(file: "-e")
      result
    end
    files = ->(result) { output(report(result), :print_files).lines.drop(1).map { |l| l.chomp.split("     ").last }.sort }
    assert_equal ["(no file)", "-e", "/app/a.rb", "/elsewhere/main.rb"], files.(relative.(raw_fixture).merge(cwd: "/elsewhere"))
    assert_equal ["(no file)", "-e", "/app/a.rb", "main.rb"], files.(relative.(raw_fixture)), "no absolute main.rb"
    # The suffix of one absolute path: that file; of two: left as it is.
    with_a_main = relative.(raw_fixture)
    with_a_main[:frames][3] = with_a_main[:frames][3].merge(file: "/app/main.rb")
    assert_equal ["(no file)", "-e", "/app/a.rb", "/app/main.rb"], files.(with_a_main)
    with_two = relative.(raw_fixture)
    with_two[:frames][2] = with_two[:frames][2].merge(file: "/app/main.rb")
    with_two[:frames][3] = with_two[:frames][3].merge(file: "/lib/main.rb")
    assert_equal 3, files.(with_two).count { |file| file.end_with?("main.rb") }
    # --select-files sees the resolved path.
    only = report(relative.(raw_fixture).merge(cwd: "/elsewhere"), select_files: ["/elsewhere"])
    assert_equal ["<main> 11\n"], output(only, :print_stackcollapse).lines.sort
  end

  def test_method_shows_callers_callees_and_code
    Dir.mktmpdir do |dir|
      source = File.join(dir, "a.rb")
      File.write(source, "class A\n  # run\n  def run\n    pow\n    concat\n  end\nend\n")
      result = raw_fixture
      result[:frames][2] = result[:frames][2].merge(file: source, lines: { 4 => [6, 0], 5 => [3, 0], 3 => [2, 2] })
      text = output(report(result), :print_method, "A#run")
      assert_match(/\AA#run \(#{Regexp.escape(source)}:3\)\n/, text)
      assert_match(/samples: +2 self +\(15\.4%\)  \/ +11 total +\(84\.6%\)/, text)
      assert_match(/callers \(11 total\):\n +11  \(100\.0%\)  <main>\n/, text)
      assert_match(/callees \(9 total\):\n +6  \( 66\.7%\)  A#pow\n +3  \( 33\.3%\)  A#concat;x\n/, text)
      assert_match(/ +6 +\(46\.2%\) \/ +0 +\(0\.0%\)  \| +4  \|     pow\n/, text)
      assert_match(/ +2 +\(15\.4%\) \/ +2 +\(15\.4%\)  \| +3  \|   def run\n/, text)
      assert_match(/A#pow/, output(report(result), :print_method, /pow|concat/))
      error = assert_raises(ArgumentError) { output(report(result), :print_method, "B#nope") }
      assert_match(/no method named "B#nope"/, error.message)
    end
  end

  def test_source_that_cannot_be_read_is_said_so
    result = raw_fixture
    result[:frames][2] = result[:frames][2].merge(lines: { 4 => [6, 0] })
    assert_match(/source not available: \/app\/a\.rb/, output(report(result), :print_method, "A#run"))
  end

  # Graphviz itself renders the call graph.
  def test_graphviz_renders_with_dot
    dot = output(report, :print_graphviz)
    assert_match(/\Adigraph profile \{/, dot)
    Dir.mktmpdir do |dir|
      File.write(File.join(dir, "g.dot"), dot)
      out, err, status = run_tool("dot", "-Tsvg", File.join(dir, "g.dot"))
      assert status.success?, "dot failed: #{err}"
      assert_includes out, "<svg"
      %w[A#run A#pow A#concat;x].each { |name| assert_includes out, name }
    end
    # Each edge: the caller's count of calls into the callee, drawn 1 + 4 *
    # its share of all samples wide.
    names = dot.scan(/^  (f\d+) \[label="(.*?)\\n/).to_h
    edges = dot.scan(/^  (f\d+) -> (f\d+) \[label="(\d+)", penwidth=([\d.]+)\];$/)
               .map { |from, to, count, width| [names.fetch(from), names.fetch(to), count.to_i, width] }
    result = raw_fixture
    expected = result[:frames].values.flat_map do |frame|
      (frame[:edges] || {}).map do |callee, count|
        [frame[:name], result[:frames][callee][:name], count, format("%.2f", 1 + 4.0 * count / result[:samples])]
      end
    end
    assert_equal expected.sort, edges.sort
    assert_equal 4, edges.size
    # Frames under the fraction are left out.
    refute_includes output(report, :print_graphviz, node_fraction: 0.5), "A#concat"
    assert_raises(ArgumentError) { output(report, :print_graphviz, node_fraction: 2) }
  end

  # callgrind_annotate (valgrind) reads our callgrind file: its per-function
  # self samples are the frames' self samples.
  def test_callgrind_annotate_reads_the_callgrind_output
    Dir.mktmpdir do |dir|
      path = File.join(dir, "callgrind.out.1")
      File.write(path, output(report, :print_callgrind))
      out, err, status = run_tool("callgrind_annotate", path)
      assert status.success?, "callgrind_annotate failed: #{err}"
      assert_match(/13 \(100\.0%\)\s+PROGRAM TOTALS/, out)
      assert_match(%r{^ *6 \(46\.15%\)  /app/a\.rb:A#pow$}, out)
      assert_match(%r{^ *3 \(23\.08%\)  /lib/str\.rb:A#concat:x$}, out)
      assert_match(%r{^ *2 \(15\.38%\)  /app/a\.rb:A#run$}, out)
      inclusive, = run_tool("callgrind_annotate", "--inclusive=yes", path)
      # Inclusive: A#run's 2 self samples and the 6 + 3 of its callees.
      assert_match(%r{^ *11 \(84\.62%\)  /app/a\.rb:A#run$}, inclusive)
    end
  end

  # stackprof's own Report reads our --json output and prints the same table.
  def test_stackprof_reads_our_json
    skip_statistics_under_valgrind
    require "stackprof"
    clock = Process::CLOCK_THREAD_CPUTIME_ID
    real = Strobe.run(mode: :cpu, interval: 500, raw: true) do
      deadline = Process.clock_gettime(clock) + 0.1
      (1..200).sum.to_s * 3 while Process.clock_gettime(clock) < deadline
    end
    assert_operator real[:samples], :>, 50
    Dir.mktmpdir do |dir|
      path = File.join(dir, "p.json")
      File.write(path, output(report(real), :print_json))
      theirs = StringIO.new
      StackProf::Report.from_file(path).print_text(false, nil, nil, nil, nil, nil, theirs)
      ours = output(report(real), :print_text)
      assert_equal table_rows(theirs.string), table_rows(ours)
    end
  end

  # The engine keeps Strings (some made from non-String names) in C memory
  # while it allocates: GC at every allocation, with compaction on, must
  # change nothing.
  def test_reports_survive_gc_at_every_allocation
    result = raw_fixture
    result[:frames][4] = result[:frames][4].merge(name: :symbol_name, file: nil)
    # escaped, and converted to UTF-8: Strings made while the report runs
    result[:frames][3] = result[:frames][3].merge(name: "A#\e[2Jp\u00f6w;\n".encode("ISO-8859-1"))
    formats = %i[print_text print_stackcollapse print_graphviz print_callgrind print_files]
    expected = formats.map { |f| output(report(result), f) }
    actual = under_gc_stress { formats.map { |f| output(report(result), f) } }
    assert_equal expected, actual
    assert_includes expected[1], "symbol_name"
    assert_includes expected[0], "A#\\e[2Jp\u00f6w;\\n\n"
    assert_includes expected[1], "A#\\e[2Jp\u00f6w:\\n 6\n"
  end

  def test_hostile_numbers_raise_profile_error
    huge = raw_fixture.merge(raw: [2, 1, 2, 2**62 - 1, 2, 1, 2, 2**62 - 1, 2, 1, 2, 2**62 - 1, 2, 1, 2, 2**62 - 1, 2, 1, 2, 2**62 - 1])
    assert_raises(Strobe::ProfileError) { output(report(huge), :print_stackcollapse) }
    # An id that is not a frame is an error with a filter too.
    bad = raw_fixture.merge(raw: [2, 1, 77, 3])
    assert_raises(Strobe::ProfileError) { output(report(bad, reject_names: [/pow/]), :print_stackcollapse) }
    bad_lines = raw_fixture
    bad_lines[:frames][2] = bad_lines[:frames][2].merge(lines: [[1, 2]])
    error = assert_raises(Strobe::ProfileError) { output(report(bad_lines), :print_method, "A#run") }
    assert_match(/lines of A#run/, error.message)
  end

  def test_per_file_totals_of_a_deep_stack
    depth = 5000
    frames = (1..depth).to_h { |i| [i, { name: "f#{i}", file: "/f#{i % 7}.rb", total_samples: 1, samples: 0 }] }
    result = { mode: :cpu, samples: 3, frames: frames, raw: [depth, *(1..depth), 3] }
    totals = Strobe::Native.report_files(result, nil).to_h { |file, total, self_count| [file, [total, self_count]] }
    assert_equal 7, totals.size
    assert(totals.all? { |_, (total, _)| total == 3 }, "each file counted once per sample: #{totals.inspect}")
    assert_equal 3, totals.values.sum { |_, self_count| self_count }
  end

  # --- names that would drive a terminal (issue 18) ---

  # A name with ESC sequences, a newline, ';', a C1 control (CSI), DEL and a
  # byte that is not UTF-8; a file name with others; a thread name too.
  EVIL_NAME = "evil\e[2J\nname;x\u009b31m\x7f".b + "\xff".b
  EVIL_SHOWN = "evil\\e[2J\\nname;x\\u009B31m\\x7F\\xFF"
  EVIL_FILE = "/app/\e]0;pwned\a\r\tred.rb"
  EVIL_FILE_SHOWN = "/app/\\e]0;pwned\\x07\\r\\tred.rb"
  EVIL_THREAD = "worker\e[8m"

  def hostile_fixture
    result = raw_fixture
    result[:frames][3] = result[:frames][3].merge(name: EVIL_NAME.dup.force_encoding(Encoding::UTF_8), file: EVIL_FILE)
    result[:frames][2] = result[:frames][2].merge(file: EVIL_FILE, lines: { 4 => [6, 0] })
    result[:threads] = { 7 => { name: EVIL_THREAD, samples: 13, states: { running: 10, waiting: 2, blocked: 1 } } }
    result
  end

  # Nothing a terminal acts on: valid UTF-8 without C0 (but newline), DEL
  # or C1 characters.
  def assert_printable(text, what)
    text = text.dup.force_encoding(Encoding::UTF_8)
    assert text.valid_encoding?, "#{what}: not valid UTF-8: #{text.inspect[0, 300]}"
    bad = text.scan(/[\x00-\x09\x0b-\x1f\x7f\u0080-\u009f]/)
    assert_empty bad, "#{what}: control characters #{bad.uniq.inspect} in #{text.inspect[0, 600]}"
  end

  def test_text_reports_escape_control_characters
    result = hostile_fixture
    evil = result[:frames][3][:name]
    {
      text: output(report(result), :print_text),
      text_of_the_thread: output(report(result, thread: 7), :print_text),
      text_by_total: output(report(result), :print_text, sort_by_total: true),
      files: output(report(result), :print_files),
      files_without_raw: output(report(result.reject { |k, _| k.to_s.start_with?("raw") }), :print_files),
      method: output(report(result), :print_method, evil),
      callers: output(report(result), :print_method, "A#run"),
      file: output(report(result), :print_file, "red.rb"),
    }.each do |what, text|
      # ReportSource's lines (source, or "source not available: FILE")
      # keep tabs, as source code has them; harmless on a terminal.
      assert_printable(%i[method callers file].include?(what) ? text.delete("\t") : text, what)
      assert_includes text, %i[file files files_without_raw].include?(what) ? EVIL_FILE_SHOWN : EVIL_SHOWN, what
    end
    assert_includes output(report(result), :print_text), "#{EVIL_SHOWN}\n"
    assert_includes output(report(result), :print_text), "worker\\e[8m"
    assert_includes output(report(result, thread: 7), :print_text), "  Thread: 7 (worker\\e[8m)\n"
    assert_includes output(report(result), :print_method, "A#run"),
                    "source not available: #{EVIL_FILE_SHOWN.sub('\\t', "\t")})"
    walked = StringIO.new
    report(result).walk_method(StringIO.new("9\e[2J\n\n"), walked, "A#run")
    assert_printable(walked.string.delete("\t"), "walk")
    assert_match(/^ +2\)  #{Regexp.escape(EVIL_SHOWN)}$/, walked.string)
    assert_includes walked.string, "Not a choice: 9\\e[2J"
  end

  def test_errors_quoting_names_escape_control_characters
    result = hostile_fixture
    result[:frames][3] = result[:frames][3].merge(name: "evil\e[2J\nname")
    [
      -> { report(result).print_file(StringIO.new, "none\e[2J") },
      -> { report(result).print_method(StringIO.new, "none\e[2J\u009b") },
      -> { report(result, thread: "t\e[2J") },
      -> { report(result.merge(threads: { "t\e[1m" => {} }), thread: 1) },
      lambda do
        bad = hostile_fixture
        bad[:frames][3] = bad[:frames][3].merge(name: "evil\e[2J\nname", lines: [[1, 2]])
        report(bad).print_method(StringIO.new, bad[:frames][3][:name])
      end,
    ].each_with_index do |call, i|
      error = assert_raises(ArgumentError, Strobe::ProfileError) { call.call }
      assert_printable(error.message, "error #{i}")
      assert_match(/\\e\[/, error.message, "error #{i}")
    end
  end

  # A trace's reports (written in Ruby) follow the same rules.
  def test_trace_reports_escape_control_characters
    frames = {
      1 => { name: "<main>", file: "/app/main.rb", line: 1, calls: 1, total_time: 0.003, self_time: 0.001,
             edges: { 2 => 2 }, call_times: { 2 => 0.002 } },
      2 => { name: EVIL_NAME.dup.force_encoding(Encoding::UTF_8), file: EVIL_FILE, line: 3, calls: 2,
             total_time: 0.002, self_time: 0.002 },
    }
    trace = { mode: :trace, samples: 3, frames: frames, clock: "wall\e[5m" }
    %i[print_text print_files print_callgrind print_graphviz].each do |format|
      text = output(report(trace), format)
      assert_printable(text, format)
      refute_includes text, "\e", format
    end
    assert_includes output(report(trace), :print_text), EVIL_SHOWN
    assert_includes output(report(trace), :print_text), "Mode: trace(wall\\e[5m)"
    assert_includes output(report(trace), :print_files), EVIL_FILE_SHOWN
    assert_printable(output(report(trace), :print_method, frames[2][:name]), "trace method")
    callgrind = output(report(trace), :print_callgrind)
    assert_includes callgrind, "fn=#{EVIL_SHOWN.tr(';', ':')}\n"
    assert_includes callgrind, "fl=#{EVIL_FILE_SHOWN.tr(';', ':')}\n"
    assert_includes output(report(trace), :print_graphviz), "label=\"#{EVIL_SHOWN.gsub('\\', '\\\\\\\\')}\\n"
  end

  # Folded stacks and callgrind: one name can neither end a line nor split a
  # stack, and what they show is printable too.
  def test_machine_formats_keep_their_syntax_with_hostile_names
    result = hostile_fixture
    folded = output(report(result), :print_stackcollapse)
    assert_printable(folded, "stackcollapse")
    assert_equal 4, folded.lines.size
    folded.lines.each { |line| assert_match(/\A[^;\n]+(;[^;\n]+)* \d+\n\z/, line) }
    assert_includes folded, "<main>;A#run;#{EVIL_SHOWN.tr(';', ':')} 6\n"
    callgrind = output(report(result), :print_callgrind)
    assert_printable(callgrind, "callgrind")
    callgrind.lines.drop(6).each do |line|
      assert_match(/\A(\n|c?f[ln]=\(\d+\)( .*)?\n|calls=\d+ \d+\n|\d+ \d+\n)\z/, line)
    end
    assert_includes callgrind, ") #{EVIL_SHOWN.tr(';', ':')}\n"
    Dir.mktmpdir do |dir|
      path = File.join(dir, "callgrind.out.1")
      File.write(path, callgrind)
      out, err, status = run_tool("callgrind_annotate", path)
      assert status.success?, "callgrind_annotate failed: #{err}"
      assert_includes out, EVIL_SHOWN.tr(";", ":")
    end
  end

  def test_graphviz_with_hostile_names_renders
    dot = output(report(hostile_fixture), :print_graphviz)
    assert_printable(dot, "graphviz")
    assert_includes dot, "label=\"#{EVIL_SHOWN.gsub('\\', '\\\\\\\\')}\\n"
    Dir.mktmpdir do |dir|
      File.write(File.join(dir, "g.dot"), dot)
      out, err, status = run_tool("dot", "-Tsvg", File.join(dir, "g.dot"))
      assert status.success?, "dot failed: #{err}"
      assert_includes out, "evil\\e[2J\\nname;x"
    end
  end

  # The C engine and Report.printable show every byte, and names in other
  # encodings, alike: in text rows, folded stacks and DOT labels.
  def test_c_and_ruby_escape_alike
    names = (0..255).map { |b| "a".b + b.chr + "z" } +
            ["\u009f\u00a0\u00e9\u{1F600}", "\xE3\x81Z".b, "\xF0\x9F\x98".b, "\xED\xA0\x80".b, "\xC2".b,
             "caf\u00e9\e".encode("ISO-8859-1"), "\u3042\n".encode("Shift_JIS"), "x\ty".encode("UTF-16LE"),
             "\xff\xfe".dup.force_encoding("Shift_JIS"), "a;b\"c\\d", :"sym\e"]
    frames = names.each_with_index.to_h { |name, i| [i + 1, { name: name, file: "f.rb", total_samples: 1, samples: 1 }] }
    raw = frames.keys.flat_map { |id| [1, id, 1] }
    result = { mode: :cpu, samples: names.size, frames: frames, raw: raw }
    rows = Strobe::Native.report_text(result, nil, false, nil).force_encoding(Encoding::UTF_8).lines
    shown = rows.map { |row| row.chomp.sub(/\A *1 +\(0\.4%\) +1 +\(0\.4%\)     /, "") }
    expected = names.map { |name| Strobe::Report.printable(name) }
    assert_equal expected.sort, shown.sort
    assert_printable(rows.join, "rows")
    folded = Strobe::Native.report_folded(result, nil).force_encoding(Encoding::UTF_8).lines.map { |l| l.chomp.sub(/ 1\z/, "") }
    assert_equal expected.map { |name| name.tr(";", ":") }.sort, folded.sort
    labels = output(report(result), :print_graphviz, node_fraction: 0).scan(/label="(.*?)\\n1 \(0\.4%\) self/).flatten
    assert_equal names.map { |name| report(result).dot_escape(name) }.sort, labels.sort
  end

  # A real profile of code in files whose names have control characters
  # (a method's own name cannot carry them into a profile: a block's
  # frame, as define_method makes, is named "block in ...").
  def test_a_real_profile_of_hostile_file_names
    Dir.mktmpdir do |dir|
      source = File.join(dir, "hostile\e[1m\nfile.rb")
      File.binwrite(source, "# \e[2J a comment, caf\xE9 in Latin-1\ndef hostile_file_method\n\tStrobe.sample # tab\nend\n".b)
      load source
      eval("def hostile_eval_method = Strobe.sample", binding, "(eval\e]0;title\a)", 1) # rubocop:disable Security/Eval
      result = Strobe.run(mode: :custom, raw: true) do
        3.times { hostile_file_method }
        2.times { hostile_eval_method }
      end
      {
        files: [output(report(result), :print_files), "hostile\\e[1m\\nfile.rb"],
        eval_file: [output(report(result), :print_files), "(eval\\e]0;title\\x07)"],
        method: [output(report(result), :print_method, "Object#hostile_file_method"), "hostile\\e[1m\\nfile.rb:2)"],
        file: [output(report(result), :print_file, "file.rb"), "# \\e[2J a comment, caf\\xE9 in Latin-1"],
        callgrind: [output(report(result), :print_callgrind), "hostile\\e[1m\\nfile.rb"],
      }.each do |what, (text, expected)|
        assert_printable(text.delete("\t"), what)
        assert_includes text, expected, what
      end
      assert_includes output(report(result), :print_file, "file.rb"), "|     3  | \tStrobe.sample # tab\n", "tabs in source kept"
    end
  end

  def test_source_of_special_files_is_not_read
    result = raw_fixture
    result[:frames][2] = result[:frames][2].merge(file: "/dev/zero", lines: { 4 => [6, 0] })
    assert_match(%r{source not available: /dev/zero}, output(report(result), :print_method, "A#run"))
  end
end

