# frozen_string_literal: true

require "digest"
require "uri"
require_relative "../http_server"
require_relative "errors"
require_relative "../fork_hook"

module Strobe
  class Continuous
    # The pull endpoint of continuous profiling: pprof profiles for scrapers
    # that speak Go's net/http/pprof (Grafana Alloy's pyroscope.scrape,
    # Parca), served from inside the profiled process by Strobe::HTTPServer
    # (threads of its own, never profiled; deadlines, limits, 503s):
    #
    #   GET /debug/pprof/profile?seconds=N   a profile over the next N
    #                                        seconds (1 to MAX_SECONDS = 60,
    #                                        default 30 as Go's)
    #   GET /debug/pprof/allocs[?seconds=N]  allocations (over the next N
    #                                        seconds when asked)
    #   GET /debug/pprof/                    a list of the two
    #
    # Each body is the profiler's gzipped pprof bytes as they are (a pprof
    # file is gzipped protobuf: no Content-Encoding). The profiler answers
    # profile(seconds:) and allocs(seconds:) (nil: no duration asked) with
    # those bytes, or raises Busy (500 with its message, as Go's when it
    # cannot enable CPU profiling) or Unavailable (404). Producing a profile
    # holds a handler for its N seconds: HANDLERS at once, more wait their
    # turn (MAX_QUEUED, then 503); a client that goes away meanwhile is
    # noticed only when its response is written. The client then has
    # response_timeout seconds to take the bytes.
    #
    # No Host check (scrapers reach it by any name) and no CORS: with a
    # token, every request carries it, as Alloy's bearer_token sends it
    # (Authorization: Bearer TOKEN) or as a basic auth password (any user);
    # any other gets 401 from the accepting thread as soon as its head is
    # in, so that no handler, place in the queue or profile is ever spent
    # on it. Without a token, only a loopback address is served (any user
    # of this host may ask); any other address needs insecure: true to
    # serve whoever reaches it. Only GET is answered (405).
    #
    # Forked children close the listening socket as they start (Strobe::
    # ForkHook: Kernel#fork, Process.fork, IO.popen("-"), Process.daemon),
    # so the port is free once this process ends (a daemon listens anew if
    # it calls listen). A child forked by C code calling fork(2) keeps its
    # copy open; and any child keeps its copies of the connections being
    # answered as it forked (their clients still get every byte:
    # Content-Length says how many).
    # Strobe's own fork handler (Native.close_in_children) is Serve's: it
    # takes one descriptor.
    class PullServer < HTTPServer
      # The prefix of its threads' names and of its lines on stderr.
      NAME = "strobe pull"
      INDEX = "/debug/pprof/"
      PROFILE = "/debug/pprof/profile"
      ALLOCS = "/debug/pprof/allocs"
      DEFAULT_SECONDS = 30
      # The longest profile asked (Alloy asks its scrape interval less one
      # second, 14 by default; Parca its scrape interval): no one holds the
      # one-at-a-time profiler longer.
      MAX_SECONDS = 60
      # host:port, the host in brackets when IPv6, empty for every interface.
      ADDRESS = /\A(?:\[(?<ipv6>[^\[\]\s]+)\]|(?<name>[^\[\]:\s]*)):(?<port>\d+)\z/
      # What a token may hold: what an Authorization header carries as is.
      TOKEN = /\A[\x21-\x7e]+\z/

      @listening = []
      ForkHook.in_child { PullServer.close_listening }

      class << self
        # The listening sockets of the pull servers not stopped yet.
        attr_reader :listening

        # Parses "host:port": [host, port], the host "" for every interface;
        # ArgumentError saying what is wrong.
        def parse_address(address)
          match = ADDRESS.match(address.to_s) if address.is_a?(String)
          unless match
            raise ArgumentError, "the pull address must be HOST:PORT (127.0.0.1:6060, [::1]:6060, :6060 for every " \
                                 "interface), got #{address.inspect}"
          end

          port = match[:port].to_i
          raise ArgumentError, "the port of #{address} must be from 0 to 65535" unless port.between?(0, 65_535)

          [match[:ipv6] || match[:name], port]
        end

        # In a forked child: closes the listening sockets (ForkHook).
        def close_listening
          @listening.dup.each do |socket|
            socket.close unless socket.closed?
          rescue IOError, SystemCallError
            nil
          end
          @listening.clear
        end
      end

      # The address bound ("127.0.0.1", "::1", "::" or "0.0.0.0" for every
      # interface).
      attr_reader :host

      # Binds address ("host:port", port 0: any free one); ArgumentError for
      # a malformed address or token, or for an address other than loopback
      # without a token unless insecure: true; SystemCallError or
      # SocketError when it cannot bind (the port is taken, the name
      # unknown). profiler answers profile(seconds:) and allocs(seconds:);
      # token, when given, is what every request must carry. The deadlines
      # are HTTPServer's.
      def initialize(address, profiler:, token: nil, insecure: false, err: $stderr,
                     request_timeout: REQUEST_TIMEOUT, response_timeout: RESPONSE_TIMEOUT)
        host, port = PullServer.parse_address(address)
        unless profiler.respond_to?(:profile)
          raise ArgumentError, "the profiler must answer profile(seconds:), got #{profiler.inspect}"
        end
        unless token.nil? || (token.is_a?(String) && token.match?(TOKEN))
          raise ArgumentError, "the token must be printable ASCII without spaces (what an Authorization header carries)"
        end
        raise ArgumentError, "insecure: must be true or false, got #{insecure.inspect}" unless [true, false].include?(insecure)

        @profiler = profiler
        @token_digest = (Digest::SHA256.digest(token) if token)
        super(host, port, name: NAME, err: err, request_timeout: request_timeout, response_timeout: response_timeout)
        refuse_to_serve_anyone(address) unless token || insecure || HTTPServer.loopback?(@server.local_address)
        @host = @server.local_address.ip_address
        PullServer.listening << @server
      end

      # Heads arriving at once from one address group (HTTPServer's
      # Incoming.group_of): a fifth connection pushes out the group's
      # oldest, so a client sending slowly, its token not yet seen, holds
      # at most these and pushes out no one else's.
      MAX_PENDING_PER_PEER = 4

      # The index of what is served.
      def url
        "http://#{@host.include?(':') ? "[#{@host}]" : @host}:#{@port}#{INDEX}"
      end

      # Stops serving (a profile being taken is abandoned: its handler is
      # killed) and closes the port.
      def stop
        super
      ensure
        PullServer.listening.delete(@server)
      end

      private

      # Bound where others reach it, without a token: closed, and why.
      def refuse_to_serve_anyone(address)
        @server.close
        raise ArgumentError, "the pull endpoint at #{address} would serve profiles to anyone who reaches it: give " \
                             "a token every request must carry (token:, STROBE_PPROF_TOKEN with autorun), listen on " \
                             "127.0.0.1, or serve without one on purpose (insecure: true, STROBE_PPROF_INSECURE=1)"
      end

      def max_pending_per_peer
        MAX_PENDING_PER_PEER
      end

      # Every interface: IPv6's, which on Linux takes IPv4 too (unless
      # net.ipv6.bindv6only is set), or IPv4's where there is no IPv6.
      def listen(host, port)
        return super unless host.empty?

        begin
          super("::", port)
        rescue SocketError, Errno::EAFNOSUPPORT, Errno::EADDRNOTAVAIL
          super("0.0.0.0", port)
        end
      end

      # 401 at once for a request without the token, whatever it asks.
      def screen(request)
        [401, "unauthorized\n", ["WWW-Authenticate: Bearer"]] unless authorized?(request)
      end

      # Answers a GET (screen saw the token, if any).
      def route(request, out)
        return respond(out, 405, "only GET\n", extra: ["Allow: GET"]) unless request.verb == "GET"

        params = query_params(request.query)
        return respond(out, 400, "bad query string\n") unless params

        case request.path
        when PROFILE then send_profile(out, params)
        when ALLOCS then send_allocs(out, params)
        when INDEX, INDEX.chomp("/") then respond(out, 200, index)
        else respond(out, 404, "not found: #{INDEX} lists what is served\n")
        end
      end

      # Whether the request carries the token (always, when there is none),
      # compared in constant time (of digests: the time says nothing of its
      # length either).
      def authorized?(request)
        return true unless @token_digest

        given = presented_token(request.header("authorization"))
        given ? HTTPServer.secure_equal?(Digest::SHA256.digest(given), @token_digest) : false
      end

      # The token an Authorization header carries: "Bearer TOKEN", or
      # "Basic" with the token as the password of any user; nil when none.
      def presented_token(authorization)
        scheme, credentials = authorization.to_s.split(" ", 2)
        case scheme&.downcase
        when "bearer" then credentials&.strip
        when "basic" then credentials.to_s.strip.unpack1("m0").split(":", 2)[1]
        end
      rescue ArgumentError # not base64
        nil
      end

      # The query's parameters, the first value of each, as bytes (no
      # encoding to be invalid in); nil when it cannot be decoded.
      def query_params(query)
        URI.decode_www_form(query.to_s, Encoding::BINARY).reverse.to_h
      rescue ArgumentError
        nil
      end

      # The seconds asked for: default when absent, false when not a whole
      # number from 1 to MAX_SECONDS.
      def seconds_asked(params, default)
        value = params.fetch("seconds") { return default }
        value.match?(/\A\d{1,9}\z/) && value.to_i.between?(1, MAX_SECONDS) && value.to_i
      end

      # 400 for seconds that are no whole number from 1 to MAX_SECONDS.
      def bad_seconds(out, params)
        asked = params["seconds"][0, 40].inspect
        respond(out, 400, "bad seconds: #{asked} (a whole number from 1 to #{MAX_SECONDS})\n")
      end

      # /debug/pprof/profile: a profile over the seconds asked (30 if none).
      def send_profile(out, params)
        seconds = seconds_asked(params, DEFAULT_SECONDS)
        return bad_seconds(out, params) unless seconds

        send_pprof(out, "profile") { @profiler.profile(seconds: seconds) }
      end

      # /debug/pprof/allocs: allocations, over the seconds asked if any (a
      # profiler without allocs has none: 404).
      def send_allocs(out, params)
        seconds = seconds_asked(params, nil)
        return bad_seconds(out, params) if seconds == false
        return respond(out, 404, "allocations are not profiled here\n") unless @profiler.respond_to?(:allocs)

        send_pprof(out, "allocs") { @profiler.allocs(seconds: seconds) }
      end

      # Sends the pprof bytes the block returns, or what it raised instead:
      # Busy 500, Unavailable 404, anything else 500 (and a line on stderr).
      def send_pprof(out, filename)
        body = yield
        raise TypeError, "the profiler gave a #{body.class}, not pprof bytes" unless body.is_a?(String)
      rescue Busy => e
        respond(out, 500, "#{e.message.chomp}\n")
      rescue Unavailable => e
        respond(out, 404, "#{e.message.chomp}\n")
      rescue StandardError => e
        note "no #{filename} profile: #{e.class}: #{e.message.lines.first&.chomp}"
        respond(out, 500, "no #{filename} profile: #{e.class}\n")
      else
        disposition = %(Content-Disposition: attachment; filename="#{filename}")
        out.write(head(200, "application/octet-stream", body.bytesize, [disposition]))
        out.write(body)
      end

      # /debug/pprof/: what is served here.
      def index
        <<~TEXT
          Strobe is profiling process #{Process.pid}; pprof profiles (gzipped protobuf), as Go's net/http/pprof:
          #{PROFILE}?seconds=N  over the next N seconds (1 to #{MAX_SECONDS}, default #{DEFAULT_SECONDS})
          #{ALLOCS}             allocations (?seconds=N: over the next N seconds)
        TEXT
      end
    end
  end
end
