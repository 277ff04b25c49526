# frozen_string_literal: true

# The parts of a result a report can be restricted to: the samples of one
# thread (or of the threads sharing a name), and those taken serving
# requests to one endpoint.

module Strobe
  class Report
    # Report.thread_result, Report.thread_ids, Report.thread_name,
    # Report.endpoint_result and Report.request_endpoint (Report extends
    # this). The subsets are derived in C from a result with raw data.
    module Parts
      # The result of one thread, or of the threads sharing a name (see
      # thread_ids), derived (in C) from a result with raw data.
      def thread_result(result, thread)
        ids = thread_ids(result, thread)
        refuse_trace(result, "a report for one thread")
        unless Stacks.samples?(result, :threads)
          raise ArgumentError, "a report for one thread needs per-sample data: profile with raw: true (strobe run --raw)"
        end
        return Native.thread_subset(result, ids.first) if ids.size == 1

        Native.windows_subset(result, ids.map { |id| [id, nil, nil] }) # every sample of each
      end

      # The ids of the threads thread stands for: thread itself when it is a
      # key of result[:threads]; for a String, the id it spells when that is a
      # key, or else every thread it names ("main" also names the main
      # thread). Raises ArgumentError listing the threads when there is none.
      def thread_ids(result, thread)
        threads = result[:threads].is_a?(Hash) ? result[:threads] : {}
        return [thread] if threads.key?(thread)

        number = thread.to_s.match?(/\A-?\d+\z/)
        if thread.is_a?(String)
          return [thread.to_i] if number && threads.key?(thread.to_i)

          named = threads.select { |_, info| info.is_a?(Hash) && (info[:name] == thread || (thread == "main" && info[:main])) }
          return named.keys unless named.empty?
        end
        known = threads.map { |id, info| (name = thread_name(info)) ? "#{name} (#{id})" : id.to_s }
        raise ArgumentError, printable("no thread #{number ? thread : thread.inspect} in this profile " \
                                       "(threads: #{known.empty? ? 'none' : known.join(', ')})")
      end

      # A thread's name as reports show it: its own, or "main" for the main
      # thread when it has none; nil for another thread without one.
      def thread_name(info)
        return nil unless info.is_a?(Hash)

        info[:name] || ("main" if info[:main])
      end

      # The samples a result's threads took while serving requests to
      # endpoint (derived in C from raw data and the request markers).
      def endpoint_result(result, endpoint)
        requests = Array(result[:markers]).select do |m|
          m.is_a?(Hash) && m[:type].to_s == "request" && m[:start].is_a?(Integer) && m[:end].is_a?(Integer)
        end
        endpoints = requests.map { |m| request_endpoint(m) }
        windows = requests.zip(endpoints).filter_map { |m, e| [m[:thread], m[:start], m[:end]] if e == endpoint }
        if windows.empty?
          known = endpoints.tally.sort_by { |e, n| [-n, e.to_s] }.first(10).map(&:first)
          known = known.empty? ? "none: it was not profiled by Strobe::Middleware" : known.join(", ")
          raise ArgumentError, printable("no request to endpoint #{endpoint.inspect} in this profile (endpoints: #{known})")
        end
        refuse_trace(result, "a report for one endpoint")
        unless Stacks.samples?(result, :threads, :times)
          raise ArgumentError, "a report for one endpoint needs per-sample data: profile with raw: true (strobe run --raw)"
        end

        Native.windows_subset(result, windows)
      end

      # For what (a report, an export) that needs the samples: raises
      # ProfileError when result is a trace, which records none (the
      # message for a profile without raw data suggests raw: true, which
      # cannot help there).
      def refuse_trace(result, what)
        return unless result[:mode].to_s == "trace"

        raise ProfileError, "#{what} needs samples, and mode trace records none: it counts calls and times " \
                            "(the text, files, method, graphviz and callgrind reports show them)"
      end

      # A request marker's endpoint, as pprof's endpoint label has it.
      def request_endpoint(marker)
        data = marker[:data]
        endpoint = data[:endpoint] if data.is_a?(Hash)
        endpoint.is_a?(String) ? endpoint : marker[:name]
      end
    end
  end
end
