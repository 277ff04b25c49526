# frozen_string_literal: true

# A mutational fuzzer for everything that reads a profile file: the loader
# (JSON, gzip, Strobe's compact stacks expanded in C) and every report and
# export built on what it accepts (the C report engine, the pprof, Firefox
# and speedscope writers, thread subsets, merging). Inputs are mutated from
# the seed corpus (test/fuzz/corpus): byte flips,
# truncation, splices, and JSON-aware changes (numbers made huge, negative
# or fractional, values of the wrong type, keys dropped, elements repeated,
# deep nesting). An input may be rejected only with Strobe::ProfileError
# (or ArgumentError from a report's own checks); any other exception is a
# finding, and a crash of the process is one too.
#
#   ruby -Ilib test/fuzz/fuzz.rb [INPUTS] [SEED]     (defaults 100000, 1)
#
# The supervisor runs the inputs in a worker process, restarting it after
# a crash; every input is reproducible from (SEED, index):
#
#   ruby -Ilib test/fuzz/fuzz.rb --one SEED INDEX    (prints the input's bytes
#                                                     to stdout, then runs it)
#
# It prints one summary line and exits 1 if anything was found.
require "json"
require "zlib"
require "stringio"
require "rbconfig"

module StrobeFuzz
  CORPUS = File.expand_path("corpus", __dir__)
  ALLOWED = %w[Strobe::ProfileError ArgumentError].freeze
  WEIRD = [0, -1, 1, 2**31, 2**32 + 1, 2**63 - 1, 2**64, -2**63, 1.5, -0.0, 1e300, "", "x", "\u0000", nil, true,
           false, [], {}, [1], { "a" => 1 }, "9" * 40].freeze

  module_function

  def seeds
    @seeds ||= Dir[File.join(CORPUS, "*")].sort.map do |path|
      bytes = File.binread(path)
      bytes = Zlib.gunzip(bytes) if bytes.start_with?("\x1f\x8b".b)
      bytes
    end
  end

  def input(seed, index)
    rng = Random.new(seed * 1_000_003 + index)
    base = seeds[rng.rand(seeds.size)]
    bytes = rng.rand < 0.6 ? json_mutation(base, rng) : byte_mutation(base, rng)
    rng.rand < 0.1 ? Zlib.gzip(bytes) : bytes
  end

  def byte_mutation(bytes, rng)
    bytes = bytes.b.dup
    (1 + rng.rand(4)).times do
      case rng.rand(6)
      when 0 then bytes = bytes[0, rng.rand(bytes.size + 1)] # truncate
      when 1 then 4.times { i = rng.rand([bytes.size, 1].max); bytes.setbyte(i, rng.rand(256)) if i < bytes.size }
      when 2 then i = rng.rand(bytes.size + 1); bytes.insert(i, rng.bytes(1 + rng.rand(8)))
      when 3 then i = rng.rand(bytes.size + 1); bytes[i, rng.rand(16)] = ""
      when 4 then i = rng.rand(bytes.size + 1); n = rng.rand(32); bytes.insert(i, bytes[i, n] || "")
      else other = seeds[rng.rand(seeds.size)].b; bytes = bytes[0, rng.rand(bytes.size + 1)] + other[rng.rand(other.size + 1)..]
      end
    end
    bytes
  end

  def json_mutation(bytes, rng)
    doc = JSON.parse(bytes)
    (1 + rng.rand(3)).times { doc = mutate(doc, rng, 0) }
    JSON.generate(doc, max_nesting: false).b
  rescue JSON::ParserError
    byte_mutation(bytes, rng)
  end

  # A copy of value with one change somewhere inside it.
  def mutate(value, rng, depth)
    if (value.is_a?(Hash) || value.is_a?(Array)) && !value.empty? && rng.rand < 0.85 - depth * 0.05
      copy = value.dup
      key = value.is_a?(Hash) ? copy.keys[rng.rand(copy.size)] : rng.rand(copy.size)
      case rng.rand(10)
      when 0 then copy.delete(key)
      when 1 then value.is_a?(Hash) ? copy["#{key}x"] = copy[key] : copy.insert(key, copy[key])
      else copy[key] = mutate(copy[key], rng, depth + 1)
      end
      return copy
    end
    case rng.rand(5)
    when 0 then nest(value, 50 + rng.rand(20_000))
    when 1 then value.is_a?(Integer) ? value + [-1, 1, -value - 1, value * 1000].sample(random: rng) : WEIRD.sample(random: rng)
    else WEIRD.sample(random: rng)
    end
  end

  def nest(value, depth)
    depth.times.reduce(value) { |inner, _| [inner] }
  end

  NULL = File.open(File::NULL, "w")

  # Runs one input through the loader and the reports. Returns :rejected,
  # :accepted, or raises for a finding.
  def run(bytes)
    result = begin
      Strobe::ProfileFile.parse(bytes, "fuzz")
    rescue *ALLOWED.map { |name| Object.const_get(name) }
      return :rejected
    end
    report_on(result)
    :accepted
  rescue *ALLOWED.map { |name| Object.const_get(name) }
    :rejected
  end

  def report_on(result)
    report = Strobe::Report.new(result)
    report.print_text(NULL, limit: 20)
    report.print_files(NULL)
    report.print_callgrind(NULL)
    report.print_graphviz(NULL, node_fraction: 0)
    first = result[:frames].values.first
    report.print_method(NULL, first[:name].to_s) if first.is_a?(Hash) && !first[:name].to_s.empty?
    Strobe::Merge.results([result, result])
    return unless result[:raw].is_a?(Array)

    report.print_stackcollapse(NULL)
    report.stack_tree
    report.print_flamegraph(NULL, view: :timeline)
    report.print_pprof(NULL)
    report.print_firefox(NULL)
    report.print_speedscope(NULL)
    (result[:threads].is_a?(Hash) ? result[:threads].keys.first(3) : []).each do |id|
      Strobe::Report.new(result, thread: id).print_text(NULL)
    end
  end

  # Worker: inputs from..from+count-1, announcing each index on stdout.
  def work(seed, from, count)
    counts = Hash.new(0)
    $stdout.sync = true
    (from...(from + count)).each do |index|
      $stdout.write("#{index}\n")
      begin
        counts[run(input(seed, index))] += 1
      rescue StandardError, SystemStackError, NoMemoryError => e
        warn "finding #{seed} #{index}: #{e.class}: #{e.message.lines.first&.chomp}\n  #{e.backtrace&.first(4)&.join("\n  ")}"
        counts[:findings] += 1
      end
    end
    $stdout.write("done #{counts[:accepted]} #{counts[:rejected]} #{counts[:findings]}\n")
  end

  # Supervisor: runs the worker in chunks, restarting after a crash.
  def supervise(inputs, seed)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    totals = Hash.new(0)
    crashes = []
    next_index = 0
    while next_index < inputs
      count = [inputs - next_index, 50_000].min
      last = nil
      done = nil
      IO.popen([RbConfig.ruby, *$LOAD_PATH.first(3).flat_map { |p| ["-I", p] }, __FILE__, "--work", seed.to_s,
                next_index.to_s, count.to_s], "r", err: $stderr) do |io|
        io.each_line do |line|
          if line.start_with?("done ")
            done = line.split.drop(1).map(&:to_i)
          else
            last = line.to_i
          end
        end
      end
      if done
        totals[:accepted] += done[0]
        totals[:rejected] += done[1]
        totals[:findings] += done[2]
        next_index += count
      else
        crashes << last
        warn "crash #{seed} #{last}: #{$?.inspect} (reproduce: ruby -Ilib #{__FILE__} --one #{seed} #{last})"
        next_index = (last || next_index) + 1
      end
    end
    seconds = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    puts format("fuzz: %d inputs in %.0f s (seed %d): %d accepted, %d rejected as corrupt, %d findings, %d crashes",
                inputs, seconds, seed, totals[:accepted], totals[:rejected], totals[:findings], crashes.size)
    totals[:findings].zero? && crashes.empty?
  end
end

if $PROGRAM_NAME == __FILE__
  require "strobe"
  require "strobe/report"
  require "strobe/merge"
  case ARGV[0]
  when "--work" then StrobeFuzz.work(Integer(ARGV[1]), Integer(ARGV[2]), Integer(ARGV[3]))
  when "--one"
    bytes = StrobeFuzz.input(Integer(ARGV[1]), Integer(ARGV[2]))
    $stdout.binmode.write(bytes)
    $stdout.puts
    p StrobeFuzz.run(bytes)
  else
    exit(StrobeFuzz.supervise(Integer(ARGV[0] || 100_000), Integer(ARGV[1] || 1)) ? 0 : 1)
  end
end
