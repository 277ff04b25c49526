# frozen_string_literal: true

require "json"
require "zlib"
require "stringio"
require_relative "atomic_file"
require_relative "markers"

module Strobe
  # Reads and writes profile files: JSON, gzipped when the path ends in .gz.
  #
  # The file holds the result Hash with its raw arrays replaced by a compact
  # "stacks" section: a node table (parent, frame position, line) once, then
  # per sample a node, a thread position, a time delta in microseconds and,
  # where samples carry GVL states, a state number (0 unknown, 1 running,
  # 2 waiting for the GVL, 3 blocked), as columns. Strobe::Native.compact/expand (C) convert between the two, so
  # the stackprof-shaped raw arrays are derived on load, never stored.
  #
  # Loading never calls Marshal.load: a profile from someone else must not be
  # able to run code.
  module ProfileFile
    FORMAT = 1
    THREAD_STATES = %i[running waiting blocked].freeze
    GZIP_MAGIC = "\x1f\x8b".b
    MARSHAL_MAGIC = "\x04\x08".b

    # Whether bytes (in any encoding) start with magic's bytes.
    def self.magic?(bytes, magic)
      bytes.byteslice(0, magic.bytesize).b == magic
    end
    RAW_KEYS = %i[raw raw_lines raw_sample_timestamps raw_timestamp_deltas raw_sample_threads raw_sample_states].freeze

    module_function

    # value as a count: a non-negative Integer below 2**64, as the C engine
    # counts (0 for nil); anything else raises ProfileError naming what.
    # Reports and merging use it on every count they add up, files on every
    # count they read.
    def count(value, what)
      return 0 if value.nil?
      return value if value.is_a?(Integer) && !value.negative? && value < 2**64

      raise ProfileError, "#{what} is not a non-negative integer below 2**64: #{value.inspect[0, 40]}"
    end

    # Whether path names a directory for profiles (it ends in "/" or is
    # one), rather than a file.
    def directory?(path)
      path.end_with?("/") || File.directory?(path)
    end

    # The file name extension of each format.
    EXTENSIONS = { json: ".json", sampling_prof: ".txt", pprof: ".pb.gz", firefox: ".firefox.json",
                   speedscope: ".speedscope.json" }.freeze

    # A profile's file in directory dir, named by mode, process, time (to
    # the millisecond) and the process's count of such names (saves in one
    # millisecond replaced each other's files), with format's extension:
    # what the middleware and the signal toggle write.
    def path_in(dir, result, format = :json)
      stamp = Time.now.strftime("%Y%m%d-%H%M%S-%L")
      File.join(dir, "strobe-#{result[:mode]}-#{Process.pid}-#{stamp}-#{next_name_number}#{EXTENSIONS.fetch(format)}")
    end

    # No Mutex: the signal toggle names files in trap context, where a
    # Mutex cannot be taken. Read, add and store are one stretch of
    # bytecode without a call or a branch (so @names starts at 0 here),
    # where the GVL does not change hands.
    @names = 0
    def next_name_number
      @names += 1
    end
    private_class_method :next_name_number

    # Writes result to target (a path, or an IO) in format (see
    # Options::FORMATS): :json, Strobe's own (what Strobe.load reads back),
    # or an export for another tool. A path is written by AtomicFile: whole
    # or not at all (a new temporary file, created exclusively with a random
    # name, renamed into place; never written through a symlink), with the
    # mode File.open would give a new file; gzipped when it ends in .gz, and
    # always for :pprof (its format is gzipped protobuf). Returns the path.
    def write(result, target, format: :json)
      unless Options::FORMATS.include?(format)
        raise ArgumentError, "format must be #{Options::FORMATS.map(&:inspect).join(' or ')}, got #{format.inspect}"
      end
      return write_to(result, target, format, gzip: format == :pprof) if target.respond_to?(:write)

      path = target.respond_to?(:to_path) ? target.to_path : target.to_s
      gzip = format == :pprof || path.end_with?(".gz")
      AtomicFile.write(path) { |file| write_to(result, file, format, gzip: gzip) }
    end

    # Writes result to io in format, through gzip when asked; the exporters
    # (C) hand their output to io in chunks as they go. Returns io.
    def write_to(result, io, format, gzip: false)
      if gzip
        level = format == :pprof ? PPROF_GZIP_LEVEL : Zlib::DEFAULT_COMPRESSION
        Zlib::GzipWriter.wrap(KeepOpen.new(io), level) { |gz| write_to(result, gz, format) }
        return io
      end

      if format != :json && result[:mode].to_s == "trace"
        raise ArgumentError, "format #{format.inspect} is built from samples, and mode trace records none: it writes :json"
      end

      case format
      when :json then io.write(JSON.generate(encode(result)))
      when :sampling_prof
        require_relative "sampling_prof"
        SamplingProf.write(result, io)
      else Native.public_send(:"export_#{format}", result, nil, io)
      end
      io.flush if io.respond_to?(:flush)
      io
    end

    # Hands writes on to an IO, and closing it only flushes: a gzip stream
    # finished over a caller's IO leaves that IO open.
    class KeepOpen
      def initialize(io)
        @io = io
      end

      def write(data)
        @io.write(data)
      end

      def flush
        @io.flush if @io.respond_to?(:flush)
        self
      end

      def close
        flush
        nil
      end
    end

    # marshal: true also loads a Marshal dump (what stackprof writes); only
    # for files one trusts, since loading Marshal data can run code.
    def read(path, marshal: false)
      parse(read_bytes(path), path.to_s, marshal: marshal, owned: true)
    rescue SystemCallError => e
      raise ProfileError, "#{path}: #{e.message.sub(/ @ \w+ - .*\z/, '')}"
    end

    # The bytes of the file at path, but no more than MAX_INFLATED, the most
    # a profile may be gunzipped: a larger file raises ProfileError (named
    # name), and so does a stream without end (/dev/zero, `<(yes)`), once
    # that much has come. A regular file's size is known: it is read whole
    # (refused unread when it is larger); anything else in one read of at
    # most the limit and a byte, so that no more is ever held.
    def read_bytes(path, name = path.to_s)
      File.open(path, "rb") do |file|
        stat = file.stat
        raise Errno::EISDIR if stat.directory?

        too_large = "#{name}: larger than #{MAX_INFLATED >> 20} MB, the most a profile may be"
        known = stat.size if stat.file? && stat.size.positive? # (files in /proc say 0)
        raise ProfileError, too_large if known.to_i > MAX_INFLATED

        bytes = file.read((known || MAX_INFLATED) + 1, known && huge_buffer(known + 1)) || "".b
        if known && bytes.bytesize > known # it grows as it is read: on to the limit
          rest = file.read(MAX_INFLATED + 1 - bytes.bytesize)
          bytes << rest if rest
        end
        raise ProfileError, too_large if bytes.bytesize > MAX_INFLATED

        bytes
      end
    end

    # An empty String with room for capacity bytes, in huge pages where the
    # kernel gives them (a large file is read into fresh memory: its page
    # faults were most of reading it).
    def huge_buffer(capacity)
      Native.advise_huge(String.new(capacity: capacity, encoding: Encoding::BINARY))
    end

    # Parses the bytes of a profile file. name is used in error messages.
    # How far its samples may expand depends on its size as stored
    # (gzipped or not; see compact.c). owned: the String is the caller's to
    # give up: emptied once parsed, to hold less at once.
    def parse(bytes, name = "profile", marshal: false, owned: false)
      raise ProfileError, "#{name}: file is empty" if bytes.empty?

      stored = bytes.bytesize
      if ProfileFile.magic?(bytes, GZIP_MAGIC)
        bytes = gunzip(bytes, name)
        owned = true
      end
      if ProfileFile.magic?(bytes, MARSHAL_MAGIC)
        return load_marshal(bytes, name, stored) if marshal

        raise ProfileError, "#{name}: a Marshal dump (stackprof's format); Strobe loads Marshal data only " \
                            "when asked (--marshal), since it can run code"
      end
      # Strobe's own file: its samples (nearly all of it) are read from the
      # text in C, JSON.parse parses the rest (json_columns.c).
      stacks = Native.stacks_range(bytes)
      doc = parse_json(stacks ? splice_stacks(bytes, *stacks) : bytes, name)
      stacks &&= StacksText.new(bytes, *stacks)
      # The text is parsed: its memory goes back now, not at the next GC
      # (a profile's text, its parsed columns and its compact form would
      # otherwise all be held at once). The caller's String is left alone.
      bytes.clear if owned && !stacks
      raise ProfileError, "#{name}: not a profile (expected a JSON object)" unless doc.is_a?(Hash)

      begin
        decode(doc, name, stored: stored, stacks_text: stacks)
      rescue TypeError, NoMethodError, ArgumentError, RangeError => e
        # A value of the wrong JSON type (or size) somewhere in the document.
        raise ProfileError, "#{name}: malformed profile (#{e.message.lines.first.chomp})"
      ensure
        bytes.clear if owned && stacks
      end
    end

    # Where a file's stacks section is still text (Native.stacks_range).
    StacksText = Struct.new(:text, :from, :to)

    def parse_json(text, name)
      JSON.parse(text, symbolize_names: true)
    rescue JSON::ParserError, EncodingError
      raise ProfileError, "#{name}: not valid JSON (truncated or corrupt)"
    end

    # The text with the stacks section at bytes from...to left empty.
    def splice_stacks(bytes, from, to)
      bytes.byteslice(0, from) << "{}" << bytes.byteslice(to, bytes.bytesize - to)
    end

    def load_marshal(bytes, name, stored = nil)
      result = Marshal.load(bytes) # rubocop:disable Security/MarshalLoad -- the caller opted in
      unless result.is_a?(Hash) && result[:frames].is_a?(Hash)
        raise ProfileError, "#{name}: the Marshal dump is not a profile"
      end

      check_raw_counts(result, name, stored)
    rescue TypeError, ArgumentError, EncodingError => e
      raise ProfileError, "#{name}: not a valid Marshal dump (#{e.message.lines.first.chomp})"
    end

    # pprof output is gzipped fast, as Go's runtime/pprof writes it
    # (gzip.BestSpeed): it is read by tools, and a profile of millions of
    # samples spent most of its export in deflate at the default level.
    PPROF_GZIP_LEVEL = Zlib::BEST_SPEED

    # Decompressed profiles stay far below this (a million raw samples make
    # about 10 MB); a file that inflates past it is refused, not read into
    # memory whole.
    MAX_INFLATED = 1 << 30
    # Nor may a small file inflate to much more than it holds: at most
    # INFLATE_RATIO times its own size, or INFLATE_FLOOR (32 MB, about three
    # million samples), whichever is more. Strobe's files compress 5 to 10
    # times in :wall and :cpu; :object and :custom files, whose samples
    # repeat a stack and a delta, measured 124 and 169 times (three million
    # samples; 161 and 227 at gzip's best level), so 256 leaves them room,
    # while a gzip bomb (deflate reaches about 1,000 times) is stopped at
    # 32 MB for a file under 128 KB, instead of at MAX_INFLATED.
    INFLATE_RATIO = 256
    INFLATE_FLOOR = 32 << 20

    def gunzip(bytes, name)
      cap = (INFLATE_RATIO * bytes.bytesize).clamp(INFLATE_FLOOR, MAX_INFLATED)
      reader = Zlib::GzipReader.new(StringIO.new(bytes))
      out = +""
      while (chunk = reader.read(1 << 20))
        out << chunk
        next if out.bytesize <= cap
        raise ProfileError, "#{name}: decompresses to more than #{MAX_INFLATED >> 20} MB" if cap == MAX_INFLATED

        raise ProfileError, "#{name}: decompresses to more than #{cap >> 20} MB, over #{INFLATE_RATIO} times its " \
                            "own size (a gzip bomb?); a genuine profile loads once gunzipped"
      end
      out
    rescue Zlib::Error => e
      raise ProfileError, "#{name}: gzip data is corrupt (#{e.message})"
    end

    def encode(result)
      frames = result.fetch(:frames)
      frame_pos = frames.keys.each_with_index.to_h
      threads = result[:threads] || {}
      doc = {
        strobe_file: FORMAT,
        version: result[:version], mode: result[:mode].to_s, interval: result[:interval],
        samples: result[:samples], gc_samples: result[:gc_samples], missed_samples: result[:missed_samples],
        metadata: result[:metadata] || {},
        frames: frames.map { |id, frame| encode_frame(id, frame) },
        threads: threads.map { |id, info| encode_thread(id, info) },
      }
      doc[:stacks] = encode_stacks(result, frame_pos, threads) if result[:stacks].is_a?(Stacks) || result[:raw]
      doc[:markers] = Markers.encode(result[:markers]) if result[:markers]
      result.each { |key, value| doc[key] = value unless doc.key?(key) || RAW_KEYS.include?(key) || %i[stacks markers].include?(key) }
      doc
    end

    def encode_thread(id, info)
      out = { id: id, name: info[:name], samples: info[:samples] }
      out[:main] = true if info[:main]
      out[:mn] = true if info[:mn]
      out[:states] = info[:states] if info[:states]
      # a trace's per-thread methods: [frame id, calls, total_time, self_time]
      out[:calls] = info[:calls] if info.key?(:calls)
      out[:frames] = info[:frames].map { |fid, f| [fid, f[:calls], f[:total_time], f[:self_time]] } if info[:frames]
      out
    end

    TRACE_KEYS = %i[calls total_time self_time].freeze

    # A trace's numbers of a frame (or a thread's frame): calls a count,
    # times non-negative seconds.
    def decode_trace_numbers(calls, total, self_time, what)
      unless [total, self_time].all? { |t| t.is_a?(Numeric) && t.finite? && !t.negative? }
        raise ProfileError, "#{what} has times that are not non-negative numbers"
      end

      { calls: count(calls, "#{what} calls"), total_time: total.to_f, self_time: self_time.to_f }
    end

    def encode_frame(id, frame)
      out = { id: id, name: frame[:name], file: frame[:file] }
      out[:line] = frame[:line] if frame.key?(:line)
      out[:native] = true if frame[:native]
      out[:total_samples] = frame[:total_samples]
      out[:samples] = frame[:samples]
      out[:edges] = frame[:edges].to_a if frame[:edges]
      out[:lines] = frame[:lines].map { |line, (total, self_count)| [line, total, self_count] } if frame[:lines]
      TRACE_KEYS.each { |key| out[key] = frame[key] if frame.key?(key) }
      out[:call_times] = frame[:call_times].to_a if frame[:call_times]
      out
    end

    # The stacks section: from the result's compact form, without its raw
    # arrays ever being built; or from the raw arrays of a result that has
    # only those (stackprof's, a merge's).
    def encode_stacks(result, frame_pos, threads)
      thread_pos = threads.keys.each_with_index.to_h
      if (compact = result[:stacks]).is_a?(Stacks)
        nodes, samples, deltas, sample_threads, states, start = compact.to_file(frame_pos, thread_pos)
        stacks = { start_time: start, nodes: nodes, samples: samples, deltas: deltas, threads: sample_threads }
        stacks[:states] = states unless states.empty?
        return stacks
      end

      stamps = result[:raw_sample_timestamps]
      deltas = result[:raw_timestamp_deltas]
      start = stamps&.first ? stamps.first - (deltas&.first || 0) : 0
      sample_threads = result[:raw_sample_threads]
      nodes, samples, sample_deltas, sample_thread_pos, states =
        Native.compact(result[:raw], result[:raw_lines], stamps, sample_threads, result[:raw_sample_states],
                       frame_pos, thread_pos, start)
      stacks = { start_time: start, nodes: nodes, samples: samples, deltas: sample_deltas, threads: sample_thread_pos }
      stacks[:states] = states unless states.empty?
      stacks
    end

    # stored: the file's size as stored, if known (it bounds how far its
    # samples may expand).
    # stacks_text: a StacksText, where the stacks section is still text
    # (doc holds an empty one in its place).
    def decode(doc, name, stored: nil, stacks_text: nil)
      return decode_stackprof(doc, name, stored) unless doc.key?(:strobe_file)
      unless doc[:strobe_file] == FORMAT
        raise ProfileError, "#{name}: Strobe file format #{doc[:strobe_file].inspect} is not supported (expected #{FORMAT})"
      end

      frames_list = expect(doc, :frames, Array, name)
      threads_list = doc[:threads].is_a?(Array) ? doc[:threads] : []
      result = header(doc, name)
      result[:frames] = frames_list.to_h { |frame| decode_frame(frame, name) }
      result[:threads] = threads_list.to_h { |t| decode_thread(t, name) }
      result[:markers] = Markers.decode(doc[:markers], name) if doc.key?(:markers)
      extras = doc.keys - %i[strobe_file frames threads stacks] - result.keys
      extras.each { |key| result[key] = doc[key] }
      if doc[:stacks]
        decode_stacks(result, stacks_text || doc[:stacks], frames_list, threads_list, name, stored)
      else
        check_raw_counts(result, name, stored)
      end
      result
    end

    def header(doc, name)
      mode = expect(doc, :mode, String, name)
      raise ProfileError, "#{name}: mode #{mode.inspect[0, 40]} is not a mode" unless mode.match?(/\A[a-z_]{1,32}\z/)
      interval = doc[:interval]
      raise ProfileError, "#{name}: interval is not an integer" unless interval.nil? || interval.is_a?(Integer)

      header = {
        version: doc[:version], mode: mode.to_sym, interval: interval,
        samples: count(expect(doc, :samples, Integer, name), "#{name}: samples"),
        gc_samples: count(doc[:gc_samples], "#{name}: gc_samples"),
        missed_samples: count(doc[:missed_samples], "#{name}: missed_samples"),
        metadata: doc[:metadata].is_a?(Hash) ? doc[:metadata] : {},
      }
      header[:truncated_samples] = count(doc[:truncated_samples], "#{name}: truncated_samples") if doc.key?(:truncated_samples)
      %i[started_at duration pid calls native_incomplete_samples dropped_markers].each do |key|
        header[key] = count(doc[key], "#{name}: #{key}") if doc.key?(key)
      end
      if doc.key?(:cwd)
        raise ProfileError, "#{name}: cwd is not an absolute path" unless doc[:cwd].is_a?(String) && doc[:cwd].start_with?("/")

        header[:cwd] = doc[:cwd]
      end
      header[:native] = true if doc[:native] == true
      header[:clock] = doc[:clock].to_sym if %w[wall cpu].include?(doc[:clock])
      header[:jit] = doc[:jit].to_sym if %w[yjit zjit].include?(doc[:jit])
      header
    end

    def decode_thread(thread, name)
      raise ProfileError, "#{name}: a thread is not an object" unless thread.is_a?(Hash)

      raise ProfileError, "#{name}: a thread's name is not a string" unless thread[:name].nil? || thread[:name].is_a?(String)

      info = { name: thread[:name], samples: count(thread[:samples], "#{name}: a thread's samples") }
      info[:main] = true if thread[:main] == true
      info[:mn] = true if thread[:mn] == true
      info[:calls] = count(thread[:calls], "#{name}: a thread's calls") if thread.key?(:calls)
      if thread[:frames]
        raise ProfileError, "#{name}: a thread's frames are not a list" unless thread[:frames].is_a?(Array)

        info[:frames] = thread[:frames].to_h do |fid, calls, total, self_time|
          raise ProfileError, "#{name}: a thread's frame id is not an integer" unless fid.is_a?(Integer)

          [fid, decode_trace_numbers(calls, total, self_time, "#{name}: thread #{thread[:id].inspect} frame #{fid}")]
        end
      end
      states = thread[:states]
      if states
        unless states.is_a?(Hash) && states.all? { |k, v| THREAD_STATES.include?(k) && v.is_a?(Integer) && !v.negative? }
          raise ProfileError, "#{name}: thread #{thread[:id].inspect} has malformed states"
        end
        info[:states] = states
      end
      [thread[:id], info]
    end

    def decode_frame(frame, name)
      raise ProfileError, "#{name}: a frame is not an object" unless frame.is_a?(Hash) && frame[:id].is_a?(Integer)

      what = "#{name}: frame #{frame[:id]}"
      out = { name: frame[:name].to_s, file: frame[:file] }
      out[:line] = frame[:line] if frame.key?(:line)
      out[:native] = true if frame[:native] == true
      out[:total_samples] = count(frame[:total_samples], "#{what} total_samples")
      out[:samples] = count(frame[:samples], "#{what} samples")
      if frame[:edges]
        out[:edges] = frame[:edges].to_h do |callee, n|
          raise ProfileError, "#{what} has an edge to #{callee.inspect[0, 40]}" unless callee.is_a?(Integer)

          [callee, count(n, "#{what} edge count")]
        end
      end
      if frame[:lines]
        out[:lines] = frame[:lines].to_h do |line, total, self_count|
          raise ProfileError, "#{what} has a line #{line.inspect[0, 40]}" unless line.is_a?(Integer)

          [line, [count(total, "#{what} line total"), count(self_count, "#{what} line self")]]
        end
      end
      out.merge!(decode_trace_numbers(frame[:calls], frame[:total_time], frame[:self_time], what)) if frame.key?(:calls)
      if frame[:call_times]
        out[:call_times] = frame[:call_times].to_h do |callee, time|
          unless callee.is_a?(Integer) && time.is_a?(Numeric) && time.finite? && !time.negative?
            raise ProfileError, "#{what} has a malformed call time"
          end

          [callee, time.to_f]
        end
      end
      [frame[:id], out]
    rescue TypeError, ArgumentError, NoMethodError
      raise ProfileError, "#{name}: frame #{frame[:id].inspect} is malformed"
    end

    # stacks: the parsed section, or a StacksText where it is still text.
    def decode_stacks(result, stacks, frames_list, threads_list, name, stored = nil)
      frame_ids = frames_list.map { |f| f[:id] }
      thread_ids = threads_list.map { |t| t[:id] }
      if stacks.is_a?(StacksText)
        return Native.expand_text(result, stacks.text, stacks.from, stacks.to, frame_ids, thread_ids, stored)
      end
      raise ProfileError, "stacks is not an object" unless stacks.is_a?(Hash) # (named below)

      Native.expand(result, stacks[:nodes], frame_ids, stacks[:samples], stacks[:deltas] || [],
                    stacks[:start_time] || 0, stacks[:threads] || [], thread_ids, stacks[:states] || [], stored)
      # The columns are in the compact form now: theirs go back at once.
      %i[nodes samples deltas threads states].each { |column| stacks[column].clear if stacks[column].is_a?(Array) }
      result
    rescue ProfileError => e
      raise ProfileError, "#{name}: #{e.message}"
    end

    # A stackprof result saved as JSON (its frames keyed by id strings).
    def decode_stackprof(doc, name, stored = nil)
      frames = expect(doc, :frames, Hash, name)
      result = header(doc, name)
      result[:frames] = frames.to_h do |id, frame|
        unless frame.is_a?(Hash) && id.to_s.match?(/\A\d+\z/) &&
               [frame[:edges], frame[:lines]].all? { |v| v.nil? || v.is_a?(Hash) }
          raise ProfileError, "#{name}: frame #{id.to_s[0, 40]} is malformed"
        end

        edges = frame[:edges]&.map { |callee, n| [integer_key(callee), n] }
        lines = frame[:lines]&.map { |line, pair| [integer_key(line), *(pair.is_a?(Array) ? pair.first(2) : [pair, pair])] }
        call_times = frame[:call_times]&.map { |callee, time| [integer_key(callee), time] }
        decode_frame(frame.merge(id: id.to_s.to_i, edges: edges, lines: lines, call_times: call_times).compact, name)
      end
      result[:threads] = decode_stackprof_threads(doc[:threads], name) if doc.key?(:threads)
      # Markers are Strobe's own file form (decode); stackprof has none.
      (doc.keys - result.keys - %i[markers dropped_markers stacks]).each { |key| result[key] = doc[key] }
      stacks = doc[:stacks]
      return check_raw_counts(result, name, stored) unless stacks.is_a?(Hash) && stacks[:frame_ids].is_a?(Array)

      # JSON.generate of a Strobe result: its samples as Stacks#to_json
      # wrote them (ids, not positions).
      RAW_KEYS.each { |key| result.delete(key) }
      begin
        Native.expand(result, stacks[:nodes], stacks[:frame_ids], stacks[:samples], stacks[:deltas] || [],
                      stacks[:start_time] || 0, stacks[:threads] || [], Array(stacks[:thread_ids]),
                      stacks[:states] || [], stored)
      rescue ProfileError => e
        raise ProfileError, "#{name}: #{e.message}"
      end
      result
    end

    # The threads of a result saved as JSON (`strobe report --json`, or
    # JSON.generate of a result): {"id" => info} as Strobe's own files have
    # them, {id => info}, keys Integers again (a trace's per-thread frames'
    # too).
    def decode_stackprof_threads(threads, name)
      raise ProfileError, "#{name}: threads is not an object" unless threads.is_a?(Hash)

      threads.to_h do |id, info|
        unless info.is_a?(Hash) && (info[:frames].nil? || info[:frames].is_a?(Hash))
          raise ProfileError, "#{name}: thread #{id.to_s[0, 40]} is malformed"
        end

        frames = info[:frames]&.map do |fid, f|
          raise ProfileError, "#{name}: thread #{id.to_s[0, 40]} has a malformed frame" unless f.is_a?(Hash)

          [integer_key(fid), f[:calls], f[:total_time], f[:self_time]]
        end
        decode_thread(info.merge(id: integer_key(id), frames: frames).compact, name)
      end
    end

    # A raw array taken from a file as it is (a stackprof result, or a
    # Marshal dump) says per run of samples how many there were, and reports
    # and exports make that many per-sample entries (about 20 bytes each):
    # counts claiming more samples than the file gives numbers for are held
    # to the limit on expanding Strobe's own files (Native.expand_limit, see
    # compact.c), of the numbers of its raw data and its size as stored.
    # Counts are only added up here; a malformed raw is left to the reports,
    # which say what is wrong with it. Returns result.
    def check_raw_counts(result, name, stored = nil)
      raw = result[:raw]
      return result unless raw.is_a?(Array)

      numbers = RAW_KEYS.sum { |key| key == :raw_lines || !result[key].is_a?(Array) ? 0 : result[key].size }
      limit = Native.expand_limit(numbers, stored)
      samples = 0
      i = 0
      while i < raw.size
        depth = raw[i]
        break unless depth.is_a?(Integer) && depth >= 0 && depth <= raw.size - i - 2

        count = raw[i + depth + 1]
        break unless count.is_a?(Integer) && !count.negative?

        samples += count
        if samples > limit
          raise ProfileError, "#{name}: raw counts more than #{limit} samples, over this file's limit " \
                              "(#{Native::EXPAND_PER_NUMBER} per number of its raw data and #{Native::EXPAND_PER_BYTE} " \
                              "per byte of the file, at least #{Native::EXPAND_FLOOR})"
        end
        i += depth + 2
      end
      result
    end

    # A JSON object's key that stood for an Integer ("12"), as one.
    def integer_key(key)
      key.to_s.match?(/\A-?\d+\z/) ? key.to_s.to_i : key
    end

    def expect(doc, key, type, name)
      value = doc[key]
      return value if value.is_a?(type)

      raise ProfileError, "#{name}: #{key.inspect} is #{value.nil? ? 'missing' : "not a #{type}"}"
    end
  end
end
